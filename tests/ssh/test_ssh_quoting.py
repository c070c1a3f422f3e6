"""Values from the YAML reach the remote process as literal text over real SSH: the command
the executor sends (``setsid nohup sh -c '<env> <argv> >LOG ...'``) is quoted at every level."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from pytest_kimi.config import Node, SSHConfig
    from pytest_kimi.deploy.plan import ProcessSpec
    from pytest_kimi.deploy.ssh import SSHExecutor

    args = json.loads(sys.argv[1])
    ssh = SSHConfig(user=args["user"], key=args["key"], known_hosts=args["known_hosts"],
                    connect_timeout_s=3, command_timeout_s=30)
    node = Node("node601", args["address"], 8, ssh=ssh)
    echo = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['EVIL']]))"
    spec = ProcessSpec(args["name"], node, (sys.executable, "-c", echo, *args["values"]),
                       env={"EVIL": args["env"]})
    executor = SSHExecutor(args["work_dir"], args["run_tag"])
    handle = executor.start(spec, Path(args["dest"]))
    deadline = time.monotonic() + 30
    while executor.exit_code(handle) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    print("exit", executor.exit_code(handle))
    executor.fetch_log(handle, Path(args["dest"]))
    executor.close()
    """
)


def test_shell_metacharacters_in_values_are_passed_literally_never_run(ssh_hosts, tmp_path):
    canary = tmp_path / "pwned"
    values = [
        f"; touch {canary}1",
        f"$(touch {canary}2)",
        f"`touch {canary}3`",
        f"' ; touch {canary}4 ; '",
        f'" ; touch {canary}5 ; "',
        f"a b && touch {canary}6 | cat > {canary}7",
        "$HOME ~ * \\ \n newline",
    ]
    host = ssh_hosts.hosts[0]
    args = {
        "user": ssh_hosts.user,
        "key": str(ssh_hosts.key_path),
        "known_hosts": str(ssh_hosts.known_hosts_path),
        "address": host.address,
        "values": values,
        "env": f"x'; touch {canary}8; echo '$(touch {canary}9)",
        "name": "replica0-node0-node601",
        "work_dir": str(tmp_path / "remote"),
        "run_tag": "run $(touch " + str(canary) + "10)",  # the run folder's name, too
        "dest": str(tmp_path / "fetched.log"),
    }
    done = ssh_hosts.run_in_hub([sys.executable, "-c", SCRIPT, json.dumps(args)], timeout=60,
                                cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0 and "exit 0" in done.stdout, done.stdout + done.stderr
    argv, env = json.loads((tmp_path / "fetched.log").read_text().strip())
    assert argv == values and env == args["env"]  # exactly what the YAML said
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")) == []
