"""Import-only stand-ins for packages SGLang imports on start-up but never calls on a CPU.

SGLang on a CPU (``--device cpu --attention-backend torch_native``) imports two packages that
cannot be installed beside the CPU build of torch:

- ``sgl_kernel``: SGLang's CUDA kernels. SGLang imports it unconditionally; PyPI's builds are
  CUDA-only. On a CPU without AMX and with torch_native attention, no function of it is called:
  the CPU paths use torch operators.
- ``torchvision``: imported at start-up through the multimodal model configs and processors;
  PyPI's build links CUDA libraries and fails to load beside CPU torch. A text-only Llama never
  runs a vision transform.

Each stand-in is a module whose every name (and every submodule) resolves to a stub. Import,
attribute access, ``isinstance`` checks and subclassing work, so SGLang's module-level code runs;
a *call* writes one marked line to stderr (which is the server's log) and raises. That is why it
is safe: a stand-in computes nothing, so no result comes from it; what it cannot catch is code
that only tests a name (``hasattr``, truthiness: a stub is a class, so true) and then takes
another path, which is SGLang's own code on that path.
A real-SGLang run is then checked for the marker (``STANDIN_MARKER``) in every server log, and
fails naming the function if any was called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STANDIN_MARKER = "KIMI-STANDIN-CALLED"


class StandinCalled(RuntimeError):
    """A stand-in function was called: the real package was needed after all."""


class _StubMeta(type):
    """Lets ``Stub.anything`` resolve on the class too (``class X(stub.Base)``, ``stub.Enum.A``)."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: object, **kwargs: object) -> object:
        if cls.__dict__.get("_kimi_subclassed"):
            return super().__call__(*args, **kwargs)
        called(cls.__qualname__)
        raise AssertionError("unreachable")  # pragma: no cover


def called(name: str) -> None:
    """Say on stderr that ``name`` was called, then raise."""
    print(f"{STANDIN_MARKER} {name}", file=sys.stderr, flush=True)
    raise StandinCalled(
        f"{name} is an import-only stand-in (scripts/real_sglang/standins); the real package "
        "is not installed in this CPU-only SGLang venv"
    )


def stub_class(qualname: str) -> type:
    """A class named ``qualname``: calling it raises; subclasses of it are ordinary classes."""

    def init_subclass(sub: type, **kwargs: object) -> None:
        sub._kimi_subclassed = True

    return _StubMeta(
        qualname.rsplit(".", 1)[-1],
        (),
        {"__qualname__": qualname, "__init_subclass__": classmethod(init_subclass)},
    )


class StandinModule(types.ModuleType):
    """A module whose every missing attribute is a stub named for where it was looked up."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return stub_class(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every submodule of a stand-in package (``sgl_kernel.flash_attn`` ...)."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: object, target: object = None):
        if not fullname.startswith(self.package + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(module_name: str, version: str) -> None:
    """Turn the already-imported package ``module_name`` into a stand-in of ``version``."""
    module = sys.modules[module_name]
    module.__class__ = StandinModule
    module.__version__ = version
    module.__kimi_standin__ = True
    sys.meta_path.append(_Finder(module_name))
