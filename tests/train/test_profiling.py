"""The per-op step profile: HLO names joined to JAX op names, and a real traced step."""

from hypernet_attention.runs import registry
from hypernet_attention.train import profiling

HLO = """
ENTRY %main {
  %ynn_fusion.33 = f32[16,36]{1,0} fusion(%a, %b), kind=kCustom, metadata={op_name="jit(chunk)/while/body/closed_call/transpose(jvp(Transformer))/layers_3/attention/relative_position/hn,qkn->hqk/dot_general" stack_frame_id=8}
  %dot.7 = f32[128,16,36,4]{3,2,1,0} dot(%c, %d), metadata={op_name="jit(chunk)/while/body/jvp(Transformer)/layers_12/attention/bqhd,bkhd->bhqk/dot_general"}
  %copy.2 = u32[4]{0} copy(%e)
  %dot.9 = f32[8]{0} dot(%f, %g), metadata={op_name="jit(chunk)/while/body/closed_call/eval_jaxpr/jvp(Transformer)/layers_0/attention/bqhd,bkhd->bhqk/dot_general"}
  %dot.10 = f32[8]{0} dot(%f, %g), metadata={op_name="jit(_host_step)/jvp(Transformer)/layers_5/attention/bqhd,bkhd->bhqk/dot_general"}
}
"""


def test_instruction_ops_maps_names_shapes_and_layers():
  ops = profiling.instruction_ops(HLO)
  assert ops["ynn_fusion.33"] == (
      "f32[16,36]", "BWD/layers_L/attention/relative_position/hn,qkn->hqk/dot_general")
  assert ops["dot.7"] == ("f32[128,16,36,4]",
                          "FWD/layers_L/attention/bqhd,bkhd->bhqk/dot_general")
  assert ops["copy.2"] == ("u32[4]", "(copy, no op name)")
  # jax 0.11's `eval_jaxpr/` level is dropped: the same key as under jax 0.10.
  assert ops["dot.9"] == ("f32[8]", ops["dot.7"][1])
  # A host-fed step (C4) is one jitted step, no loop: the same key.
  assert ops["dot.10"] == ("f32[8]", ops["dot.7"][1])


def test_gpu_kernels_are_named_by_their_fusion_and_only_the_device_counts():
  """A GPU trace (shaped as the H100 window's of 2026-11-26): kernels spell `dot.7` as
  `dot_7`; the host's events of the same names are not counted again; a cuBLAS kernel no
  instruction names is its own row, so the rows add up to the device's time."""
  ops = profiling.instruction_ops(HLO)
  meta = lambda pid, name: dict(ph="M", pid=pid, name="process_name", args=dict(name=name))
  kernel = lambda pid, name, dur: dict(ph="X", pid=pid, tid=1, name=name, dur=dur)
  events = [meta(1, "/device:GPU:0"), meta(7, "/host:CPU"),
            kernel(1, "dot_7", 300.0), kernel(1, "dot_7", 100.0), kernel(1, "ynn_fusion_33", 50.0),
            kernel(1, "nvjet_sm90_tst_128x160", 150.0), kernel(7, "dot_7", 9000.0),
            kernel(7, "python3", 1e6)]
  rows = profiling.op_times(events, ops, steps=2)
  by_op = {r.op: r.ms_per_step for r in rows}
  assert by_op == {"FWD/layers_L/attention/bqhd,bkhd->bhqk/dot_general": 0.2,
                   "(kernel nvjet_sm90_tst_128x160)": 0.075,
                   "BWD/layers_L/attention/relative_position/hn,qkn->hqk/dot_general": 0.025}
  assert [r.op for r in rows][0].startswith("FWD/")  # Largest first.
  # Without a device process (XLA:CPU) every event counts, and names no instruction has
  # (the host's own events) are left out.
  cpu = [kernel(7, "dot.7", 400.0), kernel(7, "python3", 1e6)]
  assert [(r.op, r.ms_per_step) for r in profiling.op_times(cpu, ops, steps=2)] == [
      ("FWD/layers_L/attention/bqhd,bkhd->bhqk/dot_general", 0.2)]


def test_profile_of_a_real_step_has_attention_forward_and_backward(tmp_path):
  config = registry.get("fuzzy_logic").get_config("model=hyla,size=smoke")
  profile = profiling.profile_train_step(config, steps=3, trace_dir=str(tmp_path))
  times = [op.ms_per_step for op in profile.ops]
  assert times == sorted(times, reverse=True) and times[0] > 0
  assert abs(sum(times) - profile.ms_per_step) < 1e-6
  attention = [op.op for op in profile.ops if "/attention/" in op.op]
  assert any(op.startswith("FWD/layers_L/") for op in attention)
  assert any(op.startswith("BWD/layers_L/") for op in attention)
  assert list(tmp_path.rglob("*.trace.json.gz"))
