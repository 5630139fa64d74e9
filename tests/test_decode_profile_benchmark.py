"""benchmarks/decode_profile.py: reading call stacks out of optimised HLO text, booking operations to
parts of the decode step, and the trace arithmetic, on hand-made inputs and on a program compiled here."""
import gzip
import json
import os

import jax
import jax.numpy as jnp
import pytest
from helpers import load_benchmark


@pytest.fixture(scope="module")
def decode_profile():
    """The benchmark as a module; importing it points XLA_FLAGS at a dump folder for its own run,
    which this process must not pass on."""
    saved = os.environ.get("XLA_FLAGS")
    try:
        return load_benchmark("decode_profile")
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved


HLO = """HloModule jit_toy

FileNames
1 "toy.py"

FunctionNames
1 "outer"
2 "MLP.__call__"
3 "_matmul"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=1 function_name_id=2 line=20 end_line=20 column=1 end_column=2}
3 {file_name_id=1 function_name_id=3 line=30 end_line=30 column=1 end_column=2}

StackFrames
1 {file_location_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}

%fused_computation.1 (param_0: f32[2,2]) -> f32[] {
  %param_0 = f32[2,2]{1,0} parameter(0)
  %bitcast.1 = f32[4]{0} bitcast(%param_0), metadata={op_name="jit(toy)/dot_general" stack_frame_id=2}
  %dot.2 = f32[2,2]{1,0} dot(%param_0, %param_0), metadata={op_name="jit(toy)/dot_general" stack_frame_id=3}
  ROOT %reduce.1 = f32[] reduce(%dot.2), metadata={op_name="jit(toy)/reduce_sum" stack_frame_id=1}
}

ENTRY %main (p: f32[2,2]) -> f32[2,2] {
  %p = f32[2,2]{1,0} parameter(0)
  %dot.1 = f32[2,2]{1,0} dot(%p, %p), metadata={op_name="jit(toy)/dot_general" stack_frame_id=3}
  ROOT %tanh_fusion = f32[2,2]{1,0} fusion(%dot.1), kind=kLoop, metadata={op_name="jit(toy)/tanh" stack_frame_id=2}
  %ynn_fusion = f32[] fusion(%p), calls=%fused_computation.1, metadata={op_name="reduce_sum" stack_frame_id=1}
}
"""


def test_call_stacks_follow_each_frame_to_its_outermost_caller(decode_profile):
    stacks = decode_profile.call_stacks(HLO)
    assert stacks["dot.1"] == (["_matmul", "MLP.__call__", "outer"], "dot_general")   # parent ids count from 1
    assert stacks["tanh_fusion"] == (["MLP.__call__", "outer"], "tanh")
    assert stacks["p"] == ([], "")                                                     # no metadata
    assert stacks["ynn_fusion"] == (["_matmul", "MLP.__call__", "outer"], "dot_general")   # its matmul, not its root


def test_each_operation_is_booked_to_its_innermost_listed_function(decode_profile):
    part_of = decode_profile.part_of
    assert part_of(["_matmul", "_adapted", "MLP.__call__", "Block.__call__"], "dot_general") == "MLP matmuls"
    assert part_of(["MLP.__call__", "Block.__call__"], "mul") == "MLP activation (SiLU, product)"
    assert part_of(["_matmul", "_adapted", "_project_heads", "Attention._project", "Attention.__call__"],
                   "dot_general") == "q, k, v projections"
    assert part_of(["Attention.__call__", "Block.__call__"], "dynamic_update_slice") == "KV cache write"
    assert part_of(["grouped_query_attention", "Attention.__call__"], "reduce_max") == "attention over the KV cache"
    assert part_of(["inverse_cdf_sample", "_decode.<locals>.pick"], "exp") == "sampling"
    assert part_of([], "") == "other (loop control, copies, no metadata)"


def _write_trace(path, events):
    threads = [{"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}
               for tid, name in ((1, "tf_XLAEigen/1"), (2, "tf_XLAEigen/2"), (3, "python"))]
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": threads + events}).encode()))


def test_op_times_sum_the_operations_of_xla_threads_and_their_covered_wall_time(decode_profile, tmp_path):
    stacks = decode_profile.call_stacks(HLO)
    trace = tmp_path / "perfetto_trace.json.gz"

    def op(tid, name, ts, dur):
        return {"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": ts, "dur": dur}

    _write_trace(trace, [op(1, "dot.1", 0, 10), op(2, "dot.1", 5, 10), op(1, "tanh_fusion", 30, 5),
                         op(1, "ThunkExecutor::Execute", 0, 100), op(2, "SlinkyThreadPool::Await", 40, 50),
                         op(3, "dot.1", 0, 1000), op(1, "copy.7", 50, 2)])
    parts, covered = decode_profile.op_times(trace, stacks)
    assert parts == {"MLP matmuls": 20, "MLP activation (SiLU, product)": 5,
                     "other (loop control, copies, no metadata)": 2}
    assert covered == 15 + 5 + 2          # [0, 15) from the two threads' overlapping dots, then [30, 35), [50, 52)


def toy_block(x, w):
    """A function the test adds to PARTS (module level: the HLO names a nested one by its qualified name)."""
    return jnp.tanh(x @ w)


def test_a_program_compiled_here_is_booked_through_its_own_stack_frames(decode_profile, tmp_path, monkeypatch):
    """The installed jaxlib's HLO text and trace carry what the benchmark reads: a matmul inside a
    function of PARTS is booked to it."""
    monkeypatch.setitem(decode_profile.PARTS, "toy_block", "toy")
    x = jnp.ones((256, 256))
    step = jax.jit(lambda x, w: toy_block(x, w).sum())
    cached = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)    # a cached program keeps its first stack frames
    try:
        stacks = decode_profile.call_stacks(step.lower(x, x).compile().as_text())
    finally:
        jax.config.update("jax_enable_compilation_cache", cached)
    assert any(stack[:1] == ["toy_block"] and primitive == "dot_general" for stack, primitive in stacks.values())
    step(x, x).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        for _ in range(3):
            step(x, x).block_until_ready()
    parts, covered = decode_profile.op_times(next(tmp_path.rglob("perfetto_trace.json.gz")), stacks)
    assert parts["toy"] > 0 and covered > 0


def test_work_per_step_counts_each_matmul_and_the_cache_read(decode_profile):
    """(FLOPs, bytes read) by hand for a 2-layer model, 3 rows, a 5-slot cache, float32."""
    from pgjax.models.transformer import ModelConfig
    c = ModelConfig(family="qwen2", vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=2)
    work = decode_profile.work_per_step(c, rows=3, cache_slots=5)
    # MLP: gate and up 8 -> 16, down 16 -> 8, per layer; bytes: weights plus 3 rows in and out
    assert work["MLP matmuls"] == (2 * 3 * (3 * 8 * 16) * 2, 4 * 2 * (3 * 8 * 16 + 3 * 3 * (8 + 16)))
    assert work["q, k, v projections"] == (2 * 3 * 8 * (4 + 2 * 2) * 2 * 2, 4 * 2 * (8 * 16 + 3 * (8 + 16)))
    assert work["attention output projection"] == (2 * 3 * 4 * 2 * 8 * 2, 4 * 2 * (8 * 8 + 3 * (8 + 8)))
    assert work["unembedding (logits)"] == (2 * 3 * 8 * 100, 4 * (8 * 100 + 3 * (8 + 100)))
    assert work["attention over the KV cache"] == (0, 2 * 2 * 3 * 2 * 5 * 2 * 4)     # K and V, float32 bytes


def test_the_roofline_bound_is_the_slower_of_compute_and_memory(decode_profile):
    assert decode_profile.roofline(2e9, 1e8, peak=1e11, bandwidth=1e10) == (0.02, "compute")
    assert decode_profile.roofline(1e9, 1e9, peak=1e11, bandwidth=1e10) == (0.1, "memory")
    assert decode_profile.roofline(0, 5e9, peak=1e11, bandwidth=1e10) == (0.5, "memory")
