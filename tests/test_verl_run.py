"""The cheap pieces of ``make profile-verl`` (checks/verl_run), in the test environment.

The run itself (a 4 GB environment, ~6 minutes, ~12 GB of memory) is ``make profile-verl``;
these test what it is built from: the CPU platform plugin, the model/tokenizer/data builder,
the vLLM distribution alias and the command lines.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from checks.verl_run import alias_vllm, build_assets, run

REPO = Path(__file__).resolve().parents[1]

PLATFORM_PROBE = """
import json, tempfile, os
import torch
import verl  # imports VERL_USE_EXTERNAL_MODULES, which registers the platform
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
from verl.plugin.platform import get_platform
platform = get_platform()
t = torch.ones(3)
folder = tempfile.mkdtemp()
torch.distributed.init_process_group(
    backend="cpu:gloo," + get_device_name() + ":" + get_nccl_backend(),
    init_method="file://" + os.path.join(folder, "store"), rank=0, world_size=1,
)
x = torch.tensor([2.0])
torch.distributed.all_reduce(x)
print(json.dumps({
    "registered": "cpu" in PlatformRegistry.registered_names(),
    "class": type(platform).__name__,
    "device": get_device_name(),
    "backend": get_nccl_backend(),
    "ray_resource": platform.ray_resource_options(1),
    "available": get_torch_device().is_available(),
    "device_count": get_torch_device().device_count(),
    "mem_total_positive": get_torch_device().mem_get_info()[1] > 0,
    "pinned_is_same": t.pin_memory() is t,
    "all_reduce": x.item(),
    "vllm_patched": "vllm" in __import__("sys").modules,
}))
"""


def test_cpu_platform_plugin_is_loaded_by_verl_and_runs_gloo():
    pytest.importorskip("verl", reason="verl not installed (pip install -e .[verl])")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VERL_USE_EXTERNAL_MODULES": run.PLATFORM_MODULE,
        "VERL_PLATFORM": "cpu",
    }
    done = subprocess.run(
        [sys.executable, "-c", PLATFORM_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe == {
        "registered": True,
        "class": "PlatformCPU",
        "device": "cpu",
        "backend": "gloo",
        "ray_resource": {"num_gpus": 1},
        "available": True,
        "device_count": 1,
        "mem_total_positive": True,
        "pinned_is_same": True,
        "all_reduce": 2.0,
        "vllm_patched": False,  # vLLM is not loaded: nothing to patch, nothing imported
    }


def test_backend_string_keeps_one_backend_per_device():
    pytest.importorskip("verl", reason="verl not installed (pip install -e .[verl])")
    from checks.verl_run.cpu_platform import _dedupe_backend

    assert _dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert _dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert _dedupe_backend("gloo") == "gloo"
    assert _dedupe_backend(None) is None


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    pytest.importorskip("transformers")
    sizes = build_assets.AssetSizes(train_prompts=6, val_prompts=2)
    out = tmp_path_factory.mktemp("assets")
    return out, build_assets.build(out, sizes), sizes


def test_assets_are_a_loadable_qwen2_tokenizer_and_verl_dataset(assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, built, sizes = assets
    assert json.loads((out / "assets.json").read_text()) == built
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 plus 2?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|im_start|>user\nWhat is 1 plus 2?<|im_end|>\n<|im_start|>assistant\n"
    # byte-level: any text round-trips
    assert tokenizer.decode(tokenizer("ünïcode 123 ####")["input_ids"]) == "ünïcode 123 ####"
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    config = model.config
    assert (config.model_type, config.head_dim, config.num_attention_heads) == ("qwen2", 64, 2)
    assert config.vocab_size == len(tokenizer) == built["vocab_size"]
    v, h, i, layers = config.vocab_size, sizes.hidden_size, sizes.intermediate_size, 2
    kv = sizes.num_kv_heads * 64
    per_layer = h * h + h + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    assert built["parameters"] == 2 * v * h + layers * per_layer + h
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert tuple(model(ids).logits.shape) == (1, ids.shape[1], v)
    train = pl.read_parquet(out / "data" / "train.parquet")
    assert train.height == 6 and pl.read_parquet(out / "data" / "val.parquet").height == 2
    first = train.row(0, named=True)
    question, answer = build_assets.prompts(6, sizes.seed)[0]
    assert first["data_source"] == "openai/gsm8k"
    assert first["prompt"] == [{"role": "user", "content": question}]
    assert first["reward_model"] == {"style": "rule", "ground_truth": answer}
    a, b = (int(w) for w in question.split("?")[0].split()[2::2])
    assert int(answer) == a + b


def test_vllm_alias_distribution(tmp_path):
    folder = alias_vllm.write_alias(tmp_path, "0.31.0")
    assert folder.name == "vllm-0.31.0.dist-info"
    found = {
        d.metadata["Name"]: d.version
        for d in importlib.metadata.distributions(path=[str(tmp_path)])
    }
    assert found == {"vllm": "0.31.0"}


def test_run_command_lines(tmp_path):
    overrides = run.verl_overrides(Path("/a"), steps=2, out=tmp_path)
    keys = dict(o.lstrip("+").split("=", 1) for o in overrides)
    assert keys["trainer.total_training_steps"] == "2"
    assert keys["algorithm.adv_estimator"] == "grpo"
    assert keys["actor_rollout_ref.actor.strategy"] == "fsdp2"
    assert keys["trainer.use_v1"] == "False"
    assert keys["actor_rollout_ref.model.path"] == "/a/model"
    assert keys["ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"] == (
        "nvtx_phases.verl.install"
    )
    env = run.verl_environment(REPO, {"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"] == f"{REPO}{os.pathsep}/x"
    assert (env["VERL_PLATFORM"], env["VERL_USE_EXTERNAL_MODULES"]) == (
        "cpu",
        "checks.verl_run.cpu_platform",
    )
    command = run.nsys_command("nsys", tmp_path / "r", ["python", "x.py"])
    assert command[:2] == ["nsys", "profile"] and command[-2:] == ["python", "x.py"]
    assert "--trace=nvtx" in command and "--sample=none" in command


def test_disaggregated_command_lines(tmp_path):
    overrides = run.disaggregated_overrides(Path("/a"), steps=6, out=tmp_path)
    keys = dict(o.lstrip("+").split("=", 1) for o in overrides)
    assert len(keys) == len(overrides)  # each key once: the sync run's values replaced
    assert keys["trainer.n_gpus_per_node"] == keys["rollout.n_gpus_per_node"] == "1"
    assert keys["ray_kwargs.ray_init.num_gpus"] == "2"  # two logical GPUs: two pools
    assert keys["actor_rollout_ref.hybrid_engine"] == "False"
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "gloo"
    assert keys["actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"] == (
        "checks.verl_run.cpu_checkpoint_engine"
    )
    assert (keys["data.train_batch_size"], keys["data.gen_batch_size"]) == ("0", "1")
    # 6 trainer steps of 2 prompts, synced every 2 steps: 3 versions, validated at version 2
    assert keys["rollout.total_rollout_steps"] == "12"
    assert keys["async_training.trigger_parameter_sync_step"] == "2"
    assert float(keys["async_training.staleness_threshold"]) > 0
    assert keys["trainer.test_freq"] == "2"
    assert "trainer.total_training_steps" not in keys
    assert keys["ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"] == (
        "nvtx_phases.verl.install"
    )
    one_step = dict(
        o.lstrip("+").split("=", 1)
        for o in run.disaggregated_overrides(Path("/a"), steps=2, out=tmp_path, mode="one_step_off")
    )
    assert (
        one_step["data.train_batch_size"] == "2"
        and "async_training.staleness_threshold" not in one_step
    )
    assert run.overrides_for("sync", Path("/a"), steps=2, out=tmp_path) == run.verl_overrides(
        Path("/a"), steps=2, out=tmp_path
    )


def test_validation_frequency_keeps_verls_last_flush():
    # VeRL flushes the last cycle's metrics after its loop only when the last version is not a
    # multiple of test_freq; it validates at the versions that are
    for cycles in range(1, 12):
        freq = run.validation_frequency(cycles)
        assert cycles % freq != 0
        assert (cycles >= 3) == any(v % freq == 0 for v in range(1, cycles + 1))


LAUNCHED = """
import json, sys
from verl.trainer.ppo import ray_trainer
print(json.dumps({"argv": sys.argv[1:], "name": __name__,
                  "hooked": hasattr(ray_trainer.marked_timer, "__nvtx_phases_original__")}))
"""


def test_driver_launcher_installs_the_hooks_then_runs_the_module(tmp_path):
    pytest.importorskip("verl", reason="verl not installed (pip install -e .[verl])")
    (tmp_path / "entry_point.py").write_text(LAUNCHED)
    done = subprocess.run(
        [sys.executable, "-m", "nvtx_phases.verl_launch", "entry_point", "a=1", "+b=2"],
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "argv": ["a=1", "+b=2"],
        "name": "__main__",
        "hooked": True,
    }


GLOO_RANK = """
import asyncio, json, sys
import torch
from checks.verl_run.cpu_checkpoint_engine import GlooCheckpointEngine, MasterMetadata

rank, host, port, world = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
engine = GlooCheckpointEngine(bucket_size=4096, is_master=False)
engine.init_process_group(rank=rank, world_size=world, master_metadata=MasterMetadata(host, port))

async def receive():
    return {name: tensor.flatten().tolist() async for name, tensor in engine.receive_weights()}

print(json.dumps(asyncio.run(receive())))
"""


def test_gloo_checkpoint_engine_broadcasts_the_weights_in_buckets():
    pytest.importorskip("verl", reason="verl not installed (pip install -e .[verl])")
    import asyncio

    import torch

    from checks.verl_run.cpu_checkpoint_engine import GlooCheckpointEngine

    generator = torch.Generator().manual_seed(0)
    weights = {  # one weight larger than a bucket (split in chunks), two smaller ones
        "embed": torch.randn(40, 50, generator=generator),
        "bias": torch.randn(7, generator=generator),
        "steps": torch.arange(300, dtype=torch.int64),
    }
    master = GlooCheckpointEngine(bucket_size=4096, is_master=True)
    metadata = master.prepare()
    actor, rollout = GlooCheckpointEngine.build_topology(2, 2, [metadata, None])
    assert actor["rank"] == [0, -1] and rollout["rank"] == [1, 2]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    receivers = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_RANK, str(rank), metadata.host, str(metadata.port), "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in rollout["rank"]
    ]
    master.init_process_group(rank=0, world_size=3, master_metadata=metadata)
    asyncio.run(master.send_weights(iter(weights.items())))
    master.finalize()
    for receiver in receivers:
        out, err = receiver.communicate(timeout=300)
        assert receiver.returncode == 0, err[-3000:]
        received = json.loads(out.strip().splitlines()[-1])
        assert received == {name: w.flatten().tolist() for name, w in weights.items()}
