"""The mock says only what SGLang says: its default responses, headers, stream chunks, info
endpoints and ``/metrics`` carry no field, header or metric SGLang 0.5.9 lacks.

SGLang's pydantic protocol models do not import without its dependencies (openai, torch,
...), so the definitions are copied here from the pinned source (SGLang ``SGLANG_VERSION``;
the file each list comes from is named beside it). Mock-only conveniences exist behind
``--mock-*`` flags (``--mock-replica-header``, ``--mock-server-info-extras``) and are checked
to be off by default. The ``/kimi/...`` routes are the mock's own, test-only endpoints: extra
paths a real server answers 404, never extra fields in SGLang's answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

SGLANG_VERSION = "0.5.9"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# -- python/sglang/srt/entrypoints/openai/protocol.py (0.5.9): pydantic model fields ------
PROTOCOL_FILE = "python/sglang/srt/entrypoints/openai/protocol.py"
USAGE_INFO = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
              "reasoning_tokens"}  # fmt: skip
COMPLETION_RESPONSE = {"id", "object", "created", "model", "choices", "usage", "metadata",
                       "sglext"}  # fmt: skip
COMPLETION_RESPONSE_CHOICE = {"index", "text", "logprobs", "finish_reason", "matched_stop",
                              "hidden_states"}  # fmt: skip
COMPLETION_STREAM_RESPONSE = {"id", "object", "created", "model", "choices", "usage", "sglext"}
COMPLETION_RESPONSE_STREAM_CHOICE = COMPLETION_RESPONSE_CHOICE
CHAT_COMPLETION_RESPONSE = COMPLETION_RESPONSE
CHAT_COMPLETION_RESPONSE_CHOICE = {"index", "message", "logprobs", "finish_reason",
                                   "matched_stop", "hidden_states"}  # fmt: skip
CHAT_MESSAGE = {"role", "content", "reasoning_content", "tool_calls"}
CHAT_COMPLETION_STREAM_RESPONSE = COMPLETION_STREAM_RESPONSE
CHAT_COMPLETION_RESPONSE_STREAM_CHOICE = {"index", "delta", "logprobs", "finish_reason",
                                          "matched_stop"}  # fmt: skip
DELTA_MESSAGE = {"role", "content", "reasoning_content", "tool_calls", "hidden_states"}
MODEL_CARD = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"}
MODEL_LIST = {"object", "data"}
ERROR_RESPONSE = {"object", "message", "type", "param", "code"}

# -- python/sglang/srt/managers/tokenizer_manager.py (0.5.9): /generate output and meta_info
TOKENIZER_MANAGER_FILE = "python/sglang/srt/managers/tokenizer_manager.py"
GENERATE_OUTPUT = {"text", "output_ids", "meta_info"}  # BatchStrOutput's out_dict
META_INFO = {
    "id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions",
    "queue_time", "prefill_launch_delay", "prefill_launch_latency", "prefill_finished_ts",
    "completion_tokens", "cached_tokens", "cached_tokens_details", "hidden_states",
    "routed_experts", "e2e_latency",
    "input_token_logprobs", "output_token_logprobs", "input_top_logprobs",
    "output_top_logprobs", "input_token_ids_logprobs", "output_token_ids_logprobs",
    "spec_accept_rate", "spec_accept_length", "spec_accept_token_num", "spec_draft_token_num",
    "spec_verify_ct", "spec_accept_histogram",
    "request_received_ts", "request_sent_to_scheduler_ts", "response_sent_to_client_ts",
    "decode_finished_ts", "inference_time", "decode_throughput",
}  # fmt: skip

# -- python/sglang/srt/entrypoints/http_server.py (0.5.9): info endpoints ------------------
HTTP_SERVER_FILE = "python/sglang/srt/entrypoints/http_server.py"
MODEL_INFO = {"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
              "weight_version", "has_image_understanding", "has_audio_understanding",
              "model_type", "architectures"}  # fmt: skip
# /server_info: {**asdict(server_args), **scheduler_info, "internal_states", "version"};
# scheduler_info from managers/scheduler.py (run_scheduler_process's result_dict)
SCHEDULER_INFO = {"status", "max_total_num_tokens", "max_req_input_len"}
SERVER_INFO_OWN = {"internal_states", "version"}
# internal_states[i]: vars(server_args) plus these (managers/scheduler.py get_internal_state)
INTERNAL_STATE_OWN = {"last_gen_throughput", "memory_usage",
                      "effective_max_running_requests_per_dp", "avg_spec_accept_length",
                      "step_time_dict"}  # fmt: skip
# /get_load: GetLoadReqOutput and its base BaseReq (managers/io_struct.py)
GET_LOAD = {"rid", "http_worker_ipc", "dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens",
            "ts_tic"}  # fmt: skip
# Response headers: SGLang (FastAPI on uvicorn) adds none of its own; these are HTTP's.
HTTP_HEADERS = {"content-type", "content-length", "date", "server", "transfer-encoding",
                "connection", "keep-alive", "cache-control"}  # fmt: skip

# -- python/sglang/srt/server_args.py (0.5.9): the ServerArgs dataclass fields --------------
SERVER_ARGS_FILE = "python/sglang/srt/server_args.py"
SERVER_ARGS_FIELDS = _words(
    """
    abort_on_priority_when_disabled admin_api_key allow_auto_truncate api_key
    attention_backend attn_cp_size base_gpu_id bucket_e2e_request_latency
    bucket_inter_token_latency bucket_time_to_first_token chat_template
    checkpoint_engine_wait_weights_before_ready chunked_prefill_size
    collect_tokens_histogram completion_template constrained_json_disable_any_whitespace
    constrained_json_whitespace_pattern context_length cpu_offload_gb crash_dump_folder
    cuda_graph_bs cuda_graph_max_bs custom_sigquit_handler custom_weight_loader
    debug_tensor_dump_inject debug_tensor_dump_input_file debug_tensor_dump_layers
    debug_tensor_dump_output_folder decode_attention_backend decode_log_interval
    decrypted_config_file decrypted_draft_config_file deepep_config deepep_mode
    delete_ckpt_after_loading device disable_chunked_prefix_cache disable_cuda_graph
    disable_cuda_graph_padding disable_custom_all_reduce disable_fast_image_processor
    disable_flashinfer_autotune disable_flashinfer_cutlass_moe_fp4_allgather
    disable_hicache_numa_detect disable_hybrid_swa_memory disable_outlines_disk_cache
    disable_overlap_schedule disable_radix_cache disable_shared_experts_fusion
    disable_tokenizer_batch_decode disaggregation_bootstrap_port
    disaggregation_decode_dp disaggregation_decode_enable_offload_kvcache
    disaggregation_decode_polling_interval disaggregation_decode_tp
    disaggregation_ib_device disaggregation_mode disaggregation_prefill_pp
    disaggregation_transfer_backend dist_init_addr dist_timeout dllm_algorithm
    dllm_algorithm_config download_dir dp_size ds_channel_config_path
    ds_heavy_channel_num ds_heavy_channel_type ds_heavy_token_num
    ds_sparse_decode_threshold dtype dynamic_batch_tokenizer_batch_size
    dynamic_batch_tokenizer_batch_timeout elastic_ep_backend
    enable_attn_tp_input_scattered enable_broadcast_mm_inputs_process
    enable_cache_report enable_cudagraph_gc enable_custom_logit_processor
    enable_deterministic_inference enable_double_sparsity enable_dp_attention
    enable_dp_lm_head enable_draft_weights_cpu_backup enable_dynamic_batch_tokenizer
    enable_dynamic_chunking enable_eplb enable_expert_distribution_metrics
    enable_flashinfer_allreduce_fusion enable_fp32_lm_head enable_fused_qk_norm_rope
    enable_hierarchical_cache enable_layerwise_nvtx_marker enable_lmcache enable_lora
    enable_lora_overlap_loading enable_memory_saver enable_metrics
    enable_metrics_for_all_schedulers enable_mixed_chunk enable_mscclpp
    enable_multi_layer_eagle enable_multimodal enable_nan_detection enable_nccl_nvls
    enable_nsa_prefill_context_parallel enable_p2p_check enable_pdmux
    enable_piecewise_cuda_graph enable_precise_embedding_interpolation
    enable_prefill_delayer enable_prefix_mm_cache enable_priority_scheduling
    enable_profile_cuda_graph enable_request_time_stats_logging
    enable_return_hidden_states enable_return_routed_experts enable_single_batch_overlap
    enable_symm_mem enable_tokenizer_batch_encode enable_torch_compile
    enable_torch_compile_debug_mode enable_torch_symm_mem enable_trace
    enable_two_batch_overlap enable_weights_cpu_backup encoder_only
    encoder_transfer_backend encoder_urls ep_dispatch_algorithm ep_num_redundant_experts
    ep_size eplb_algorithm eplb_min_rebalancing_utilization_threshold
    eplb_rebalance_layers_per_chunk eplb_rebalance_num_iterations
    expert_distribution_recorder_buffer_size expert_distribution_recorder_mode
    export_metrics_to_file export_metrics_to_file_dir extra_metric_labels
    fastapi_root_path file_storage_path flashinfer_mla_disable_ragged
    flashinfer_mxfp4_moe_precision forward_hooks fp4_gemm_runner_backend
    fp8_gemm_runner_backend gc_warning_threshold_secs generation_tokens_buckets
    gpu_id_step grammar_backend grpc_mode hf_chat_template_name hicache_io_backend
    hicache_mem_layout hicache_ratio hicache_size hicache_storage_backend
    hicache_storage_backend_extra_config hicache_storage_prefetch_policy
    hicache_write_policy hierarchical_sparse_attention_extra_config host
    init_expert_location is_embedding json_model_override_args keep_mm_feature_on_device
    kt_cpuinfer kt_max_deferred_experts_per_token kt_method kt_num_gpu_experts
    kt_threadpool_count kt_weight_path kv_cache_dtype kv_events_config language_only
    limit_mm_data_per_request load_balance_method load_format log_level log_level_http
    log_requests log_requests_format log_requests_level log_requests_target lora_backend
    lora_eviction_policy lora_paths lora_target_modules mamba_backend
    mamba_full_memory_ratio mamba_scheduler_strategy mamba_ssm_dtype
    mamba_track_interval max_loaded_loras max_lora_chunk_size max_lora_rank
    max_loras_per_batch max_mamba_cache_size max_prefill_tokens max_queued_requests
    max_running_requests max_total_tokens mem_fraction_static mm_attention_backend
    mm_enable_dp_encoder mm_max_concurrent_calls mm_per_request_timeout
    mm_process_config model_checksum model_impl model_loader_extra_config model_path
    modelopt_checkpoint_restore_path modelopt_checkpoint_save_path modelopt_export_path
    modelopt_quant moe_a2a_backend moe_dense_tp_size moe_dp_size moe_runner_backend
    mooncake_ib_device multi_item_scoring_delimiter nccl_port nnodes node_rank
    nsa_decode_backend nsa_prefill_backend nsa_prefill_cp_mode
    num_continuous_decode_steps num_reserved_decode_tokens numa_node offload_group_size
    offload_mode offload_num_in_group offload_prefetch_step otlp_traces_endpoint
    page_size pdmux_config_path piecewise_cuda_graph_compiler
    piecewise_cuda_graph_max_tokens piecewise_cuda_graph_tokens port
    pp_async_batch_depth pp_max_micro_batch_size pp_size preferred_sampling_params
    prefill_attention_backend prefill_delayer_forward_passes_buckets
    prefill_delayer_max_delay_passes prefill_delayer_token_usage_low_watermark
    prefill_delayer_wait_seconds_buckets prefill_max_requests
    priority_scheduling_preemption_threshold prompt_tokens_buckets quantization
    quantization_param_path quantize_and_serve radix_eviction_policy random_seed
    reasoning_parser remote_instance_weight_loader_backend
    remote_instance_weight_loader_seed_instance_ip
    remote_instance_weight_loader_seed_instance_service_port
    remote_instance_weight_loader_send_weights_group_ports
    remote_instance_weight_loader_start_seed_via_transfer_engine revision
    rl_on_policy_target rl_quant_profile sampling_backend sampling_defaults
    schedule_conservativeness schedule_low_priority_values_first schedule_policy
    scheduler_recv_interval served_model_name show_time_cost skip_server_warmup
    skip_tokenizer_init sleep_on_idle sm_group_num soft_watchdog_timeout
    speculative_accept_threshold_acc speculative_accept_threshold_single
    speculative_algorithm speculative_attention_mode speculative_draft_attention_backend
    speculative_draft_load_format speculative_draft_model_path
    speculative_draft_model_quantization speculative_draft_model_revision
    speculative_eagle_topk speculative_moe_a2a_backend speculative_moe_runner_backend
    speculative_ngram_branch_length speculative_ngram_capacity
    speculative_ngram_match_type speculative_ngram_max_bfs_breadth
    speculative_ngram_max_match_window_size speculative_ngram_min_bfs_breadth
    speculative_ngram_min_match_window_size speculative_num_draft_tokens
    speculative_num_steps speculative_token_map stream_interval stream_output
    swa_full_tokens_ratio tbo_token_distribution_threshold
    tokenizer_metrics_allowed_custom_labels tokenizer_metrics_custom_labels_header
    tokenizer_mode tokenizer_path tokenizer_worker_num tool_call_parser tool_server
    torch_compile_max_bs torchao_config tp_size triton_attention_num_kv_splits
    triton_attention_reduce_in_fp32 triton_attention_split_tile_size trust_remote_code
    uvicorn_access_log_exclude_prefixes warmups watchdog_timeout
    weight_loader_disable_mmap weight_version
    """
)


# -- python/sglang/srt/metrics/collector.py (0.5.9): metric names by type, and label names --
COLLECTOR_FILE = "python/sglang/srt/metrics/collector.py"
METRIC_COUNTERS = _words(
    """
    sglang:backuped_tokens_total sglang:cached_tokens_total
    sglang:cuda_graph_passes_total sglang:dp_cooperation_gpu_execution_seconds_total
    sglang:dp_cooperation_realtime_tokens_total sglang:evicted_tokens_total
    sglang:generation_tokens_total sglang:gpu_execution_seconds_total
    sglang:load_back_tokens_total sglang:num_aborted_requests_total
    sglang:num_bootstrap_failed_reqs_total sglang:num_grammar_aborted_total
    sglang:num_grammar_cache_hit_total sglang:num_grammar_timeout_total
    sglang:num_grammar_total sglang:num_prefill_retries_total sglang:num_requests_total
    sglang:num_retracted_input_tokens_total sglang:num_retracted_output_tokens_total
    sglang:num_retracted_requests_total sglang:num_so_requests_total
    sglang:num_transfer_failed_reqs_total sglang:prefetched_tokens_total
    sglang:prefill_delayer_outcomes_total sglang:prompt_tokens_total
    sglang:realtime_tokens_total
    """
)

METRIC_GAUGES = _words(
    """
    sglang:cache_config_info sglang:cache_hit_rate sglang:decode_sum_seq_lens
    sglang:engine_load_weights_time sglang:engine_startup_time sglang:gen_throughput
    sglang:is_cuda_graph sglang:kv_transfer_alloc_ms sglang:kv_transfer_bootstrap_ms
    sglang:kv_transfer_latency_ms sglang:kv_transfer_speed_gb_s
    sglang:kv_transfer_total_mb sglang:lora_pool_slots_total sglang:lora_pool_slots_used
    sglang:lora_pool_utilization sglang:mamba_usage
    sglang:max_running_requests_under_SLO sglang:max_total_num_tokens
    sglang:new_token_ratio sglang:num_decode_prealloc_queue_reqs
    sglang:num_decode_transfer_queue_reqs sglang:num_grammar_queue_reqs
    sglang:num_paused_reqs sglang:num_prefill_inflight_queue_reqs
    sglang:num_prefill_prealloc_queue_reqs sglang:num_queue_reqs
    sglang:num_retracted_reqs sglang:num_running_reqs
    sglang:num_running_reqs_offline_batch sglang:num_unique_running_routing_keys
    sglang:num_used_tokens sglang:pending_prealloc_token_usage sglang:spec_accept_length
    sglang:spec_accept_rate sglang:swa_token_usage sglang:token_usage sglang:utilization
    """
)

METRIC_HISTOGRAMS = _words(
    """
    sglang:backup_bandwidth sglang:backup_pgs sglang:e2e_request_latency_seconds
    sglang:eplb_gpu_physical_count sglang:eviction_duration_seconds
    sglang:generation_tokens_histogram sglang:grammar_compilation_time_seconds
    sglang:grammar_ebnf_size sglang:grammar_schema_count
    sglang:grammar_tree_traversal_time_avg sglang:grammar_tree_traversal_time_max
    sglang:inter_token_latency_seconds sglang:load_back_duration_seconds
    sglang:num_retractions sglang:per_stage_req_latency_seconds
    sglang:prefetch_bandwidth sglang:prefetch_pgs
    sglang:prefill_delayer_wait_forward_passes sglang:prefill_delayer_wait_seconds
    sglang:prompt_tokens_histogram sglang:queue_time_seconds
    sglang:time_to_first_token_seconds
    """
)

METRIC_SUMMARIES = _words(
    """
    sglang:eplb_balancedness
    """
)

TOKENIZER_METRICS = _words(
    """
    sglang:cached_tokens_total sglang:e2e_request_latency_seconds
    sglang:generation_tokens_histogram sglang:generation_tokens_total
    sglang:inter_token_latency_seconds sglang:num_aborted_requests_total
    sglang:num_requests_total sglang:num_retractions sglang:num_so_requests_total
    sglang:prompt_tokens_histogram sglang:prompt_tokens_total
    sglang:time_to_first_token_seconds
    """
)

# TokenizerMetricsCollector: labels from tokenizer_manager.init_metric_collector_watchdog;
# the scheduler's from managers/scheduler_metrics_mixin.py init_metrics (extra_metric_labels
# and custom labels aside: the mock sets neither).
TOKENIZER_LABELS = {"model_name"}
SCHEDULER_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"}


def _extra(keys: Iterable[str], allowed: Iterable[str]) -> set[str]:
    return set(keys) - set(allowed)


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [x[6:] for x in response.text.splitlines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def _headers_ok(response: httpx.Response) -> None:
    assert _extra((k.lower() for k in response.headers), HTTP_HEADERS) == set()


@pytest.fixture(scope="module")
def url(start_mock) -> str:
    """A mock with its defaults, an unknown flag (never echoed) and metrics on."""
    flags = ("--tp-size", "8", "--enable-metrics", "--mock-time-scale", "1000",
             "--some-future-flag", "x")  # fmt: skip
    return start_mock(*flags).url


def _post(url: str, path: str, body: Mapping[str, Any]) -> httpx.Response:
    response = httpx.post(url + path, json=body, timeout=30, trust_env=False)
    response.raise_for_status()
    _headers_ok(response)
    return response


def test_generate_chunks_and_meta_info_are_sglangs(url):
    body = {"text": "a b c", "sampling_params": {"max_new_tokens": 4}}
    for chunk in [*_events(_post(url, "/generate", {**body, "stream": True})),
                  _post(url, "/generate", body).json()]:  # fmt: skip
        assert _extra(chunk, GENERATE_OUTPUT) == set()
        assert _extra(chunk["meta_info"], META_INFO) == set(), TOKENIZER_MANAGER_FILE


def test_completions_match_sglangs_protocol_models(url):
    body = {"model": "m", "prompt": "a b", "max_tokens": 3}
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    for chunk in _events(_post(url, "/v1/completions", stream)):
        assert _extra(chunk, COMPLETION_STREAM_RESPONSE) == set(), PROTOCOL_FILE
        for choice in chunk["choices"]:
            assert _extra(choice, COMPLETION_RESPONSE_STREAM_CHOICE) == set()
        assert _extra(chunk["usage"] or {}, USAGE_INFO) == set()
    whole = _post(url, "/v1/completions", body).json()
    assert _extra(whole, COMPLETION_RESPONSE) == set()
    assert _extra(whole["choices"][0], COMPLETION_RESPONSE_CHOICE) == set()
    assert _extra(whole["usage"], USAGE_INFO) == set()


def test_chat_completions_match_sglangs_protocol_models(url):
    body = {"model": "m", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 3}
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    for chunk in _events(_post(url, "/v1/chat/completions", stream)):
        assert _extra(chunk, CHAT_COMPLETION_STREAM_RESPONSE) == set(), PROTOCOL_FILE
        for choice in chunk["choices"]:
            assert _extra(choice, CHAT_COMPLETION_RESPONSE_STREAM_CHOICE) == set()
            assert _extra(choice["delta"], DELTA_MESSAGE) == set()
        assert _extra(chunk["usage"] or {}, USAGE_INFO) == set()
    whole = _post(url, "/v1/chat/completions", body).json()
    assert _extra(whole, CHAT_COMPLETION_RESPONSE) == set()
    assert _extra(whole["choices"][0], CHAT_COMPLETION_RESPONSE_CHOICE) == set()
    assert _extra(whole["choices"][0]["message"], CHAT_MESSAGE) == set()


def test_error_body_is_sglangs_error_response(url):
    response = httpx.post(url + "/v1/chat/completions", json={"messages": []}, timeout=10)
    assert response.status_code == 400
    assert set(response.json()) == ERROR_RESPONSE, PROTOCOL_FILE


def test_info_endpoints_carry_only_sglangs_keys(url):
    for path in ("/get_server_info", "/server_info"):
        response = httpx.get(url + path, timeout=10)
        _headers_ok(response)
        info = response.json()
        allowed = SERVER_ARGS_FIELDS | SCHEDULER_INFO | SERVER_INFO_OWN
        assert _extra(info, allowed) == set(), (HTTP_SERVER_FILE, SERVER_ARGS_FILE)
        assert info["tp_size"] == 8 and info["enable_metrics"] is True
        for state in info["internal_states"]:
            assert _extra(state, SERVER_ARGS_FIELDS | INTERNAL_STATE_OWN) == set()
    for path in ("/get_model_info", "/model_info"):
        assert _extra(httpx.get(url + path, timeout=10).json(), MODEL_INFO) == set()
    models = httpx.get(url + "/v1/models", timeout=10).json()
    assert _extra(models, MODEL_LIST) == set()
    assert all(_extra(card, MODEL_CARD) == set() for card in models["data"])
    assert all(_extra(load, GET_LOAD) == set() for load in httpx.get(url + "/get_load").json())


def test_metrics_are_sglangs_names_types_and_labels(url):
    _post(url, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}})
    response = httpx.get(url + "/metrics", timeout=10)
    _headers_ok(response)
    known = {"counter": METRIC_COUNTERS, "gauge": METRIC_GAUGES,
             "histogram": METRIC_HISTOGRAMS, "summary": METRIC_SUMMARIES}  # fmt: skip
    seen = set()
    for family in text_string_to_metric_families(response.text):
        # the parser drops a counter's ``_total``; SGLang names counters with it
        name = family.name + "_total" if family.type == "counter" else family.name
        assert name in known.get(family.type, ()), (name, family.type, COLLECTOR_FILE)
        labels = TOKENIZER_LABELS if name in TOKENIZER_METRICS else SCHEDULER_LABELS
        for sample in family.samples:
            assert _extra(sample.labels, labels | {"le", "quantile"}) == set(), sample
        seen.add(name)
    # what the product reads per replica is there (pytest_kimi.report.replicacounters)
    assert {"sglang:num_requests_total", "sglang:prompt_tokens_total",
            "sglang:generation_tokens_total"} <= seen  # fmt: skip


def test_mock_only_conveniences_are_behind_flags(start_mock):
    """With the flags, the extras appear: so their absence above is the flags' doing."""
    server = start_mock("--mock-replica-header", "--mock-server-info-extras", "--x-flag", "1")
    info = httpx.get(server.url + "/get_server_info", timeout=10).json()
    assert {"unrecognized_args", "kimi_mock"} <= _extra(info, SERVER_ARGS_FIELDS)
    body = {"text": "a", "sampling_params": {"max_new_tokens": 2}, "stream": True}
    response = httpx.post(server.url + "/generate", json=body, timeout=10)
    assert "x-kimi-replica" in response.headers
    assert _extra(_events(response)[0]["meta_info"], META_INFO) == {"kimi_replica"}
