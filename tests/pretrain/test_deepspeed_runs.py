"""2-process pretraining runs under the real `deepspeed` launcher on CPU (gloo), tiny config."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.toy_engine import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("deepspeed") is None, reason="deepspeed launcher not on PATH")


def tiny_config(tmp_path, demo_corpus, run, diagnostic: bool = False, **engine) -> Path:
    cfg = {
        "model_preset": "tiny",
        "model": {"vocab_size": 30522, "cls_token_id": 101, "sep_token_id": 102, "mask_token_id": 103,
                  "img_token_id": 1, "end_token_id": 2, "fast_rcnn": {"roi_output_size": 4}},
        "data": {"caption_shards": str(demo_corpus / "shards/captions-train/*.tar"),
                 "text_shards": str(demo_corpus / "shards/text/*.tar"), "caption_batch_size": 2,
                 "text_batch_size": 2, "short_side": 64, "long_side": 96, "num_workers": 1, "shuffle_buffer": 16},
        "optim": {"lr": 2e-3, "warmup_steps": 2},
        "engine": {"run_dir": str(tmp_path / run), "steps": 20, "zero_stage": 2, "precision": "fp32",
                   "log_every": 1, "checkpoint_every": 100, "image_every": 5, "progress": False, **engine},
    }
    if diagnostic:  # the cross-modal ablation diagnostic on the demo's held-out images, every few steps
        raw = demo_corpus / "raw"
        cfg["diagnostic"] = {"flickr_root": str(raw / "flickr30k_entities"), "images": str(raw / "images"),
                             "boxes": str(raw / "flickr30k_entities" / "boxes_val.jsonl"),
                             "class_names": str(raw / "class_names.json"), "short_side": 64, "long_side": 96,
                             "max_examples": 6, "batch_size": 3}
        # and the grounding measurements: periodic on 2 images, on 3 at the end (the export, rank 0)
        cfg["grounding"] = {"flickr_root": str(raw / "flickr30k_entities"), "images": str(raw / "images"),
                            "boxes": str(raw / "flickr30k_entities" / "boxes_val.jsonl"), "short_side": 64,
                            "long_side": 96, "max_images": 3, "bootstrap": 50}
        cfg["grounding_periodic_images"] = 2
        cfg["final_ablation_examples"] = 5  # and the diagnostic on the export at the end
    path = tmp_path / f"{run}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(config: Path, *extra: str, wait: bool = True, gpus: int = 2):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    cmd = ["deepspeed", "--num_gpus", str(gpus), "--master_port", str(free_port()), "--module", "pretrain.run",
           "--config", str(config), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


def metrics(run_dir: Path) -> dict[int, dict]:
    """step -> logged scalars (a resumed run's lines override the killed run's)."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = row
    return rows


# ZeRO-0, the quick start's stage since session 89 (ZeRO-2 at two ranks: the resume tests below); ZeRO-3
@pytest.mark.parametrize("stage", [0, 3])
def test_two_rank_run_learns_logs_exports(tmp_path, demo_corpus, stage):
    steps = 30 if stage == 0 else 16
    # ZeRO-3 also runs the periodic diagnostic: its forwards gather partitioned parameters on every rank
    config = tiny_config(tmp_path, demo_corpus, f"z{stage}", diagnostic=stage == 3, zero_stage=stage, steps=steps,
                         record_keys=True, eval_every=8)
    if stage == 0:  # each caption masked twice over one detector pass (masking.word_views)
        cfg = yaml.safe_load(config.read_text())
        cfg["masking"] = {"word_views": 2}
        config.write_text(yaml.safe_dump(cfg))
    out = launch(config)
    run = tmp_path / f"z{stage}"
    rows = metrics(run)
    assert sorted(rows) == list(range(1, steps + 1))
    first = sum(rows[s]["loss/total"] for s in range(1, 5)) / 4
    last = sum(rows[s]["loss/total"] for s in range(steps - 3, steps + 1)) / 4
    assert last < first - 0.5, (first, last)
    # the two ranks trained on disjoint samples
    keys = [set((run / f"keys_rank{r}.txt").read_text().split()) for r in range(2)]
    assert keys[0] and keys[1] and keys[0].isdisjoint(keys[1])
    # TensorBoard event files hold every scalar, read back with tensorboard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for tag in ("loss/mlm_caption", "loss/mrc", "loss/mlm_text", "loss/total", "acc/mlm_caption", "acc/mrc",
                "acc/mlm_text", "lr", "grad_norm", "loss_scale", "throughput/samples_per_s", "data/skipped/caption/tar",
                "data/skipped/caption/sample", "data/skipped/text/sample",
                "throughput/tokens_per_s", "throughput/images_per_s", "data_wait_fraction", "memory/peak_bytes"):
        assert tag in scalars, tag
    assert len(events.Scalars("loss/total")) == steps
    if stage == 3:
        # periodic (every rank, ZeRO-3) at 8; at the last step the export's grounding and ablation instead
        for tag in ("xmodal/v4l/none", "xmodal/v4l/object", "xmodal/v4l/all", "xmodal/l4v_kl/none",
                    "xmodal/l4v_kl/phrase", "xmodal/l4v_kl/all", "xmodal/v4l_all_minus_none"):
            assert [e.step for e in events.Scalars(tag)] == [8], tag
        assert all(math.isfinite(e.value) for e in events.Scalars("xmodal/v4l/object"))
        for tag in ("grounding/colour/image", "grounding/colour/ablated", "grounding/mrc/visible",
                    "grounding/mrc/zeroed_named", "eval/seconds"):
            assert [e.step for e in events.Scalars(tag)] == [8, 16], tag
        final = json.loads((run / "grounding" / "grounding.json").read_text())
        colour = final["models"]["export"]["words"]["colour"]
        assert colour["image"]["clusters"] == 3 and 0.0 <= colour["image"]["mean"] <= 1.0
        assert "| colour |" in out or "colour" in (run / "grounding" / "grounding.md").read_text()
        assert (run / "grounding" / "grounding.png").read_bytes()[:4] == b"\x89PNG"
        # the export's cross-modal ablation: what the stand-alone command computes on the export, same phrases
        ours = json.loads((run / "ablation" / "results.json").read_text())["models"][f"z{stage}"]
        diag = {**yaml.safe_load(config.read_text())["diagnostic"], "max_examples": 5, "sweep": "[]"}
        cmd = [sys.executable, "-m", "diagnostics.ablation", "--model", f"export={run / 'export'}", "--out",
               str(tmp_path / "ablation_cli"), "--device", "cpu", *(f"{k}={v}" for k, v in diag.items())]
        cli = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert cli.returncode == 0, cli.stderr[-3000:]
        theirs = json.loads((tmp_path / "ablation_cli" / "results.json").read_text())["models"]["export"]
        assert ours["examples"] == theirs["examples"] == 5
        for cond in ("none", "object", "all"):
            assert ours["v4l"][cond]["mean"] == pytest.approx(theirs["v4l"][cond]["mean"], rel=1e-5), cond
            assert ours["v4l"][cond]["ci95"] == pytest.approx(theirs["v4l"][cond]["ci95"], rel=1e-5), cond
        gap = next(t for t in ours["paired_tests"] if (t["metric"], t["a"], t["b"]) == ("v4l", "none", "all"))
        assert f"all - none {gap['mean_diff']:+.3f}" in out
        assert [e.step for e in events.Scalars("xmodal_final/v4l_all_minus_none")] == [16]
    assert "train/sample" in events.Tags()["images"]
    # the export loads on its own and reproduces the live model's losses on a batch
    verify = json.loads((run / "export" / "verify.json").read_text())
    assert verify["max_abs_loss_diff"] < 1e-5, verify
    assert "TensorBoard: tensorboard --logdir" in out


def _wait_for(path: Path, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.2)


@pytest.mark.parametrize("stage,old,new", [(1, 2, 1), (2, 2, 1), (2, 1, 2), (3, 1, 2)])
def test_resume_on_another_number_of_ranks(tmp_path, demo_corpus, stage, old, new):
    """Elastic resume: ZeRO state through DeepSpeed's universal checkpoint, the reader re-dealt. ZeRO 1 and 2 on
    one rank run as stage 0, so (1, 2, 1) and (2, 2, 1) load ds_to_universal's files into a stage-0 run and
    (2, 1, 2) loads a stage-0 checkpoint, written to the universal layout by the engine, with DeepSpeed's ZeRO-2
    universal loader. Resumed on the new world at its last step, the run exports the very weights the old world
    exported; the (2, 2, 1) case instead trains on from that step (one launch fewer: the reader's part is the same
    at every stage), and no sample is trained on twice (tests/shards/test_reader.py counts every record of two
    epochs across the change)."""
    from safetensors.torch import load_file

    run = tmp_path / "elastic"
    trains_on = (stage, old) == (2, 2)
    # 32 captions in the tiny corpus: 6 + 2 steps stay inside one epoch on 2 ranks x 2 captions
    config = tiny_config(tmp_path, demo_corpus, "elastic", zero_stage=stage, steps=6, record_keys=True,
                         export=not trains_on)
    launch(config, gpus=old)
    keys_before = [k for r in range(old) for k in (run / f"keys_rank{r}.txt").read_text().split()]
    for r in range(old):
        (run / f"keys_rank{r}.txt").unlink()
    if trains_on:
        config = tiny_config(tmp_path, demo_corpus, "elastic", zero_stage=stage, steps=8, record_keys=True,
                             export=False)
    else:
        exported = load_file(str(run / "export" / "model.safetensors"))
    out = launch(config, "--resume", gpus=new)
    assert f"resumed from {run / 'checkpoints' / 'step_0000006'} at step 6 (written by {old} ranks, resumed on " \
           f"{new})" in out
    assert (run / "checkpoints" / "step_0000006" / "universal" / "COMPLETE").exists()
    written = json.loads((run / "checkpoints" / "step_0000006" / "COMPLETE").read_text())["zero_stage"]
    assert written == (0 if old == 1 and stage < 3 else stage)
    if not trains_on:
        again = load_file(str(run / "export" / "model.safetensors"))
        assert exported.keys() == again.keys() and all(torch.equal(exported[k], again[k]) for k in exported)
        return
    after = metrics(run)
    assert sorted(after) == list(range(1, 9)) and all(math.isfinite(after[s]["loss/total"]) for s in (7, 8))
    keys_after = [k for r in range(new) for k in (run / f"keys_rank{r}.txt").read_text().split()]
    assert len(keys_after) == 2 * new * 4  # steps 7 and 8, each rank 2 captions + 2 texts a step
    assert len(set(keys_before + keys_after)) == len(keys_before) + len(keys_after)


def test_sigterm_stops_gracefully_with_a_usable_checkpoint(tmp_path, demo_corpus):
    config = tiny_config(tmp_path, demo_corpus, "term", steps=500, export=False)
    proc = launch(config, wait=False)
    run = tmp_path / "term"
    _wait_for(run / "metrics.jsonl", proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    ckpts = sorted((run / "checkpoints").glob("step_*/COMPLETE"))
    assert ckpts, out[-3000:]
    stopped_at = json.loads(ckpts[-1].read_text())["step"]
    assert 1 <= stopped_at < 500
    # the checkpoint resumes: two more steps from where it stopped
    launch(config, "--resume", f"engine.steps={stopped_at + 2}")
    assert max(metrics(run)) == stopped_at + 2


def test_sigterm_to_the_launch_script_stops_every_rank_with_a_checkpoint(tmp_path, demo_corpus):
    """What a scheduler does on preemption: SIGTERM to the launcher's pid only. The ranks (which the deepspeed
    launcher does not signal on one node) stop after their step with a checkpoint, the script waits for them
    and exits 0, and no rank is left running."""
    import psutil

    config = tiny_config(tmp_path, demo_corpus, "pre", steps=500, export=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(["bash", str(ROOT / "launch/pretrain.sh"), "--config", str(config), "--gpus", "2",
                             "--master-port", str(free_port())], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    run = tmp_path / "pre"
    _wait_for(run / "metrics.jsonl", proc)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        left = [p for p in psutil.process_iter(["cmdline"]) if str(config) in " ".join(p.info["cmdline"] or [])]
        for p in left:
            p.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "stopped by signal after step" in out, out[-3000:]
    assert list((run / "checkpoints").glob("step_*/COMPLETE")), out[-3000:]
    assert not left, [p.info["cmdline"] for p in left]


def test_a_stuck_rank_ends_the_job_after_the_distributed_timeout(tmp_path, demo_corpus):
    """One rank of two stops answering (SIGSTOP: alive, but in no collective): the other's next collective
    times out after engine.dist_timeout_s and the job ends with an error instead of waiting forever."""
    import psutil

    config = tiny_config(tmp_path, demo_corpus, "stuck", steps=500, export=False, dist_timeout_s=30)
    proc = launch(config, wait=False)
    _wait_for(tmp_path / "stuck" / "metrics.jsonl", proc)
    found = [p for p in psutil.process_iter(["cmdline"])
             if "--local_rank=1" in (p.info["cmdline"] or []) and str(config) in (p.info["cmdline"] or [])]
    ranks = [p for p in found if p.ppid() not in {q.pid for q in found}]  # not its data workers (forks)
    assert len(ranks) == 1, found
    ranks[0].suspend()
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the job hung on a stuck rank") from None
    finally:
        for p in ranks:
            if p.is_running():
                p.kill()
    assert proc.returncode != 0, out[-3000:]
    assert time.monotonic() - start < 200


def test_an_error_in_the_step_ends_every_rank_instead_of_hanging(tmp_path, demo_corpus):
    """The non-finite policy stops every rank with a worker running: the job exits 3, promptly (the
    loader's workers ignore SIGTERM and used to keep each rank alive at exit, forever)."""
    config = tiny_config(tmp_path, demo_corpus, "nan", steps=30, export=False)
    cfg = yaml.safe_load(config.read_text())
    cfg["optim"]["lr"] = 1e12
    config.write_text(yaml.safe_dump(cfg))
    proc = launch(config, wait=False)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the job hung after a rank's error") from None
    assert proc.returncode == 3 and "non-finite loss or gradients at" in out, out[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-q"]))


def test_two_rank_run_on_precomputed_features_with_the_diagnostic(tmp_path, demo_corpus):
    """`python -m pretrain.features`, then pretraining that reads its shards (no detector in the step)
    with the periodic diagnostic rerunning the same extractor on the held-out images."""
    import torch

    from model.config import model_config
    from model.fast_rcnn import FastRCNN

    config = tiny_config(tmp_path, demo_corpus, "feats", diagnostic=True, steps=12, eval_every=6)
    cfg = yaml.safe_load(config.read_text())
    torch.manual_seed(0)
    weights = tmp_path / "fast_rcnn.pt"
    torch.save(FastRCNN(model_config("tiny", updates=cfg["model"]).fast_rcnn).state_dict(), weights)
    cfg["model"].update({"region_input": "features", "precomputed_feature_size": 512, "visual_ln_init": 0.05})
    cfg["model"]["fast_rcnn"]["weights"] = str(weights)
    cfg["data"]["caption_shards"] = str(tmp_path / "features" / "*.tar")
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "pretrain.features", "--config", str(config), "--input",
                    str(demo_corpus / "shards/captions-train/*.tar"), "--out", str(tmp_path / "features"),
                    "--samples-per-shard", "8"], cwd=ROOT, env=env, check=True, capture_output=True)
    out = launch(config)
    rows = metrics(tmp_path / "feats")
    assert sorted(rows) == list(range(1, 13)) and all(math.isfinite(r["loss/mrc"]) for r in rows.values())
    evals = [json.loads(line) for line in (tmp_path / "feats" / "eval.jsonl").read_text().splitlines()]
    # periodic (diagnostic + grounding; rank 0 alone at ZeRO-2) at 6, then grounding and the cross-modal ablation
    # on the export, rerunning the extractor, at 12 (where the periodic one would repeat them)
    assert [e["step"] for e in evals] == [6, 12, 12]
    assert all(math.isfinite(evals[2][f"xmodal_final/{k}"]) for k in ("v4l/all", "v4l_all_minus_none"))
    assert math.isfinite(evals[0]["xmodal/v4l/object"]) and math.isfinite(evals[0]["xmodal/l4v_kl/all"])
    assert 0.0 <= evals[0]["grounding/colour/image"] <= 1.0
    assert "xmodal/v4l/object" not in evals[1] and 0.0 <= evals[1]["grounding/colour/image"] <= 1.0
    verify = json.loads((tmp_path / "feats" / "export" / "verify.json").read_text())
    assert verify["max_abs_loss_diff"] < 1e-5, verify
    assert "exported fp32 weights" in out


def test_two_nodes_without_ssh_killed_and_resumed_compute_what_one_node_computes(tmp_path, demo_corpus):
    """2 nodes x 1 rank on localhost, each started by `launch/pretrain.sh --node-rank R` (the ssh-less per-node
    form Kubernetes and SLURM use; one hostfile, one master address), killed (SIGKILL to every process of both
    nodes) once the step-6 checkpoint is complete and resumed on its two nodes, compute step for step what one
    uninterrupted node x 2 ranks computes: the exact-resume test and the multi-node test in one (each costs
    several launches of every rank; the engine's resume does not know how many nodes its ranks are on)."""
    launch(tiny_config(tmp_path, demo_corpus, "ref", steps=12, export=False))
    expected = metrics(tmp_path / "ref")  # 1 node x 2 ranks, never stopped
    config = tiny_config(tmp_path, demo_corpus, "two_nodes", steps=12, checkpoint_every=6, export=False)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}

    def nodes(*extra: str, kill_after: Path | None = None) -> None:
        port = free_port()
        procs, logs = [], []
        for rank in (0, 1):
            logs.append(open(tmp_path / f"node{rank}-{port}.log", "w+"))
            procs.append(subprocess.Popen(
                ["bash", "launch/pretrain.sh", "--config", str(config), "--gpus", "1", "--hostfile", str(hostfile),
                 "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", str(rank), *extra],
                cwd=ROOT, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True))
        try:
            if kill_after is not None:  # a lost job: both nodes killed once the checkpoint is complete
                deadline = time.monotonic() + 300
                while not kill_after.exists():
                    logs[0].seek(0)
                    assert all(p.poll() is None for p in procs), logs[0].read()[-3000:]
                    assert time.monotonic() < deadline, f"timed out waiting for {kill_after}"
                    time.sleep(0.2)
                for proc in procs:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                return
            for proc, log in zip(procs, logs):
                proc.wait(timeout=600)
                log.seek(0)
                assert proc.returncode == 0, log.read()[-4000:]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)

    nodes(kill_after=tmp_path / "two_nodes" / "checkpoints" / "step_0000006" / "COMPLETE")
    nodes("--resume")
    got = metrics(tmp_path / "two_nodes")
    assert sorted(got) == list(range(1, 13))
    for step in range(1, 13):
        for key in ("loss/total", "loss/mlm_caption", "loss/mrc", "loss/mlm_text"):
            assert abs(got[step][key] - expected[step][key]) < 1e-5, (step, key, got[step][key], expected[step][key])
