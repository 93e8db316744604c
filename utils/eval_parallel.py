"""Lab 03 over several GPUs with lm-eval's own data parallelism, and its comparison with one GPU.

Why a launcher: lm-eval splits the problems over processes only under `accelerate launch` (one process per
GPU, each holding the whole model; rank r takes problems r, r+N, r+2N, ...; rank 0 gathers every sample
and computes the metric). The lab's kernel cannot be one of those processes, so it starts them with
`accelerate launch --multi_gpu --num_processes N`, watches them, and reads back rank 0's result. Each
worker runs `evaluation.run_gsm8k` (the course's task config, unchanged), under the profile's GPU memory
cap (utils/gpu_cap.py), and writes a status file with its peaks; a worker that fails is the lab's failure,
naming its rank. On a CPU the same path runs N CPU processes over gloo (how CI tests it).

The answers are not identical to one GPU's by default: a problem's batch neighbours differ (each rank
sorts and batches only its own share), which changes padding and shapes and so the numerics (lm-eval's
known batch-size effect). `compare` counts the samples that differ and runs the lab's paired test on them.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from . import evaluation as ev
from .eval_settings import EvalSettings
from . import gpu_cap
from .gpu_cap import shard_memory  # noqa: F401  (the sharded path plans under the cap)
from .results import atomic_write_json

REPO = Path(__file__).resolve().parents[1]
STATUS = "rank{}.json"
RESULT = "result.json"
LOAD_KEYS = ("backend", "batch_size", "max_batch_size", "dtype", "parallelize", "tensor_parallel_size",
             "data_parallel_size", "max_gen_toks", "max_length")    # the EvalSettings fields load_lm takes


class WorkerError(RuntimeError):
    """A data-parallel worker failed, stopped or never started; the message names its rank and log."""


def check_gpus(gpus, device: str, visible: int | None = None) -> int:
    """gpus: a whole number >= 1, and on a GPU no more than the GPUs this machine shows.
    On a CPU device it is the number of CPU processes (the data-parallel path tested without a GPU)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ev.EvalInputError(f"gpus: {gpus!r} must be a whole number >= 1 (the processes of lm-eval's data "
                                "parallelism, one per GPU); 1 runs in this kernel")
    if str(device).startswith("cuda") and gpus > 1:
        if visible is None:
            import torch
            visible = torch.cuda.device_count()
        if gpus > visible:
            raise ev.EvalInputError(f"gpus: {gpus} worker processes need {gpus} GPUs, but this machine shows "
                                    f"{visible} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                                    f"set gpus <= {visible}")
    return gpus


def attach_ranks(lm):
    """Give lm-eval's HF model the rank and world size of this accelerate process where lm-eval itself does
    not: it does so only when it found more than one GPU and loaded the model itself, so CPU processes and
    a model loaded by the course (GPTQ, with our kernel choice) would each evaluate every problem."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or getattr(lm, "world_size", 1) > 1:
        return lm
    from accelerate import Accelerator

    acc = getattr(lm, "accelerator", None) or Accelerator()
    lm.accelerator, lm._rank, lm._world_size = acc, acc.process_index, acc.num_processes
    return lm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(gpus: int, config: Path, port: int) -> list[str]:
    """accelerate's own launcher: torch.distributed's elastic agent under it stops every rank if one fails."""
    return [sys.executable, "-m", "accelerate.commands.launch", *(["--multi_gpu"] if gpus > 1 else []),
            "--num_processes", str(gpus),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port), "-m", "utils.eval_parallel", str(config)]


def _work_dir(out_dir: Path, label: str) -> Path:
    """A new folder per launch (workers/<label>, then <label>-2, ...): an earlier launch's logs stay."""
    base = Path(out_dir) / "workers"
    for i in range(1, 1000):
        d = base / (label if i == 1 else f"{label}-{i}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
    raise RuntimeError(f"{base} holds 999 launches of {label}")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# torch.distributed's elastic agent (under accelerate launch) reports the first rank that died, also one
# killed by a signal (the kernel's OOM killer) that had no chance to write its status
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)"
                         r"(.*?)(?:\n=====|\Z)", re.S)


def _root_cause(log: Path) -> tuple[int, str] | None:
    try:
        m = _ROOT_CAUSE.search(log.read_text(errors="replace"))
    except OSError:
        return None
    if m is None:
        return None
    sig = re.search(r"\b(SIG[A-Z]+)\b", m.group(3))        # "Signal 9 (SIGKILL) received by PID ..."
    return int(m.group(1)), f"exit code {m.group(2)}" + (f", {sig.group(1)}" if sig else "")


def _failure(work: Path, gpus: int, rc: int | None, why: str) -> WorkerError:
    """Which rank failed and how, from the workers' status files and the launcher's root cause (a rank the
    launcher stopped after another failed, or one that never started, is named as such)."""
    lines, failed = [], []
    root = _root_cause(work / "launcher.log")
    if root is not None:
        failed.append(root[0])
        lines.append(f"the launcher saw rank {root[0]} die first ({root[1]})")
    for r in range(gpus):
        st = _read(work / STATUS.format(r)) or {"state": "never started"}
        if st["state"] == "failed":
            failed += [] if r in failed else [r]
            lines.append(f"rank {r} failed: {st.get('error', '?')} (log: {work / f'rank{r}.log'})")
        elif st["state"] != "done":
            lines.append(f"rank {r}: {st['state']} (stopped when another rank failed, or killed; "
                         f"log: {work / f'rank{r}.log'})")
    head = f"worker rank {failed[0]} of {gpus} failed" if failed else f"the {gpus} data-parallel workers failed"
    return WorkerError(f"gpus={gpus}: {head} ({why}, launcher exit code {rc}); " + "; ".join(lines)
                       + f"; launcher log: {work / 'launcher.log'}. No result of this run is kept as complete.")


def run_gsm8k_parallel(model_path: str, out_dir: str | Path, *, label: str, gpus: int,
                       data_files: dict[str, Path] | None, settings: EvalSettings,
                       timeout_s: float | None = None, poll_s: float = 0.5) -> dict:
    """evaluation.run_gsm8k's result, computed by `gpus` worker processes under accelerate launch.

    Adds "parallel": {"gpus", "wall_seconds" (launch to exit: loading included), "launched_at" (epoch s),
    "workers": per-rank status (device, generation seconds, problems, GPU and host peaks, the decode summary,
    and where its time went: worker_phases)}; throughput becomes the whole run's (problems over the slowest
    rank's generation seconds). Raises WorkerError naming the failed rank.
    """
    device = settings.device
    check_gpus(gpus, device)
    # the folder and its weight files are checked here, once, before any process starts (settings: when built)
    ev.model_args(model_path, settings.backend, param=settings.param, max_gen_toks=settings.max_gen_toks,
                  max_length=settings.max_length)
    work = _work_dir(out_dir, label)
    config = work / "config.json"
    atomic_write_json(config, {"model_path": str(model_path), "out_dir": str(Path(out_dir).resolve()),
                               "label": label, "device": device, "work": str(work.resolve()),
                               "data_files": {k: str(v) for k, v in (data_files or {}).items()} or None,
                               "settings": settings.as_dict()})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    if not str(device).startswith("cuda"):
        env["ACCELERATE_USE_CPU"] = "true"                 # MULTI_CPU: gloo instead of NCCL
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // gpus)))
    t0, launched_at = time.monotonic(), time.time()
    with open(work / "launcher.log", "wb") as log:
        proc = subprocess.Popen(launch_command(gpus, config, _free_port()), cwd=str(REPO), env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                    os.killpg(proc.pid, signal.SIGTERM)       # the launcher stops its workers; else the finally
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        pass
                    raise _failure(work, gpus, proc.returncode, f"timed out after {timeout_s:.0f} s")
                time.sleep(poll_s)
        finally:
            if proc.poll() is None:                          # the kernel was interrupted: leave no workers
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    wall = time.monotonic() - t0
    states = [_read(work / STATUS.format(r)) or {} for r in range(gpus)]
    if proc.returncode != 0 or any(s.get("state") != "done" for s in states):
        raise _failure(work, gpus, proc.returncode, "a worker exited with an error")
    result = _read(work / RESULT)
    if result is None:
        raise WorkerError(f"gpus={gpus}: every rank finished but rank 0 wrote no {work / RESULT}")
    slowest = max(s["throughput"]["seconds"] for s in states)
    tokens = sum(s["throughput"]["generated_tokens"] for s in states)
    result["throughput"] = {"seconds": slowest, "problems": result["n"], "generated_tokens": tokens,
                            "problems_per_s": result["n"] / slowest if slowest > 0 else None,
                            "tokens_per_s": tokens / slowest if slowest > 0 else None}
    result["parallel"] = {"gpus": gpus, "wall_seconds": wall, "launched_at": launched_at, "workers": states,
                          "work_dir": str(work)}
    return result


def _cut(text: str, stops: tuple[str, ...]) -> str:
    for stop in stops:
        if stop and text.endswith(stop):
            return text[: -len(stop)]
    return text


def compare(one: dict, many: dict, filt: str = "strict-match", stops: tuple[str, ...] = ()) -> dict:
    """Sample for sample: generations and scores that differ between two runs of the same problems, and the
    lab's paired test (one run as "golden", the other as "int4" of utils.stats.paired_analysis).
    stops: a stop sequence one side kept at the end of its generations (a server may) is not a difference."""
    from .stats import paired_analysis

    a, b = one["problems"], many["problems"]
    if [p["doc_id"] for p in a] != [p["doc_id"] for p in b]:
        raise ValueError("the two runs did not score the same problems: compare runs with the same gsm8k_limit")
    p = paired_analysis(ev.outcomes(one, filt), ev.outcomes(many, filt))
    return {"n": len(a), "differing_generations": sum(_cut(x["generation"], stops) != _cut(y["generation"], stops)
                                                      for x, y in zip(a, b)),
            **{f"differing_scores_{f}": sum(x[f] != y[f] for x, y in zip(a, b)) for f in ev.FILTERS},
            "first_differing": next((x["doc_id"] for x, y in zip(a, b)
                                     if _cut(x["generation"], stops) != _cut(y["generation"], stops)), None),
            "acc_one": p["golden_acc"], "acc_many": p["int4_acc"], "mcnemar_p": p["mcnemar_p"],
            "diff_ci": p["diff_ci"], "table": p["table"]}


def row(setting: str, run: dict, base: dict | None = None, filt: str = "strict-match",
        stops: tuple[str, ...] = ()) -> dict:
    """One line of the lab's table: GPUs, wall time, throughput, accuracy, and the differences from base."""
    par = run.get("parallel") or {}
    out = {"setting": setting, "GPUs": par.get("gpus", "server" if run["settings"].get("endpoint") else 1), "batch": run["settings"]["batch_size"], "n": run["n"],
           "wall s": round(par.get("wall_seconds", run.get("wall_seconds", float("nan"))), 1),
           "generation s": round(run["throughput"]["seconds"], 1),
           f"{filt} %": round(100 * run["accuracy"][filt]["acc"], 2)}
    if base is not None:
        c = compare(base, run, filt, stops)
        out.update({"differing generations": c["differing_generations"],
                    "differing scores": c[f"differing_scores_{filt}"], "McNemar p": round(c["mcnemar_p"], 4)})
    return out


def check_modes(gpus, shard: bool, backend: str, endpoint: str, endpoint_model: str, device: str,
                visible: int | None = None) -> None:
    """The lab's ways of running beyond one GPU, checked together before any work: each names its parameter.
    visible: the GPUs this machine shows (None: ask torch)."""
    check_gpus(gpus, device, visible)
    if gpus > 1 and shard:
        raise ev.EvalInputError("shard: True splits one model over every visible GPU in one process, and gpus > 1 "
                                "gives each worker process a whole model; set one of them (shard, or gpus)")
    if gpus > 1 and backend != "hf":
        raise ev.EvalInputError(f"gpus: applies to backend 'hf' (lm-eval under accelerate launch); backend "
                                f"{backend!r} has its own data_parallel_size / tensor_parallel_size")
    if shard and not str(device).startswith("cuda"):
        raise ev.EvalInputError(f"shard: True splits the model over GPUs; this run is on {device!r}: set shard = False")
    if endpoint:
        from .eval_endpoint import completions_url
        completions_url(endpoint)
        if endpoint_model not in ("golden", "int4"):
            raise ev.EvalInputError(f"endpoint_model: {endpoint_model!r} must be 'golden' or 'int4': which of the "
                                    "lab's two models the server at endpoint serves")


def evaluate(name: str, path: str, out_dir: str | Path, *, gpus: int = 1, endpoint: str = "",
             endpoint_model: str = "golden", endpoint_name: str = "", endpoint_timeout_s: float = 300,
             data_files: dict[str, Path] | None, settings: EvalSettings) -> dict:
    """One of the lab's models, the way the parameters say: from the server at endpoint (for the model it
    serves), over `gpus` worker processes, or in this kernel (gpus = 1; settings.parallelize (the lab's
    shard) splits it over the GPUs)."""
    if endpoint and name == endpoint_model:
        from .eval_endpoint import run_gsm8k_endpoint
        return run_gsm8k_endpoint(endpoint, path, out_dir, label=name, served_name=endpoint_name or None,
                                  timeout_s=endpoint_timeout_s, data_files=data_files, settings=settings)
    t0 = time.monotonic()
    if gpus > 1:
        return run_gsm8k_parallel(path, out_dir, label=name, gpus=gpus, data_files=data_files, settings=settings)
    run = ev.run_gsm8k(path, out_dir, label=name, data_files=data_files, settings=settings)
    run["wall_seconds"] = time.monotonic() - t0
    return run


def agreement(path: str, out_dir: str | Path, *, problems: int, gpus: int = 1, endpoint: str = "",
              endpoint_name: str = "", endpoint_timeout_s: float = 300, filt: str = "strict-match",
              data_files: dict[str, Path] | None, settings: EvalSettings) -> list[dict]:
    """The lab's comparison table on the first `problems` problems of one model: 1 GPU against `gpus` at the
    lab's batch size and at batch size 1 (batch-invariant: each problem runs alone), and a served model
    against this kernel at batch size 1 (lm-eval sends the server one prompt at a time). Every run is new."""
    if isinstance(problems, bool) or not isinstance(problems, int) or problems < 1:
        raise ev.EvalInputError(f"compare_problems: {problems!r} must be a whole number of problems >= 1 here "
                                "(0 skips the comparison)")
    settings = settings.replace(limit=problems, parallelize=False)
    rows = []
    if gpus > 1:
        for bs in dict.fromkeys([settings.batch_size, 1]):
            s = settings.replace(batch_size=bs)
            one = run_gsm8k_parallel(path, out_dir, label=f"compare-bs{bs}-1gpu", gpus=1, data_files=data_files,
                                     settings=s)
            many = run_gsm8k_parallel(path, out_dir, label=f"compare-bs{bs}-{gpus}gpu", gpus=gpus,
                                      data_files=data_files, settings=s)
            rows += [row(f"batch {bs}, 1 GPU", one, filt=filt), row(f"batch {bs}, {gpus} GPUs", many, one, filt)]
    if endpoint:
        from .eval_endpoint import run_gsm8k_endpoint, task_stop_sequences
        here = evaluate("compare-bs1-here", path, out_dir, data_files=data_files,
                        settings=settings.replace(batch_size=1))
        served = run_gsm8k_endpoint(endpoint, path, out_dir, label="compare-served", served_name=endpoint_name or None,
                                    timeout_s=endpoint_timeout_s, data_files=data_files, settings=settings)
        rows += [row("batch 1, this kernel", here, filt=filt),
                 row("served (endpoint)", served, here, filt, stops=task_stop_sequences())]
    return rows


def worker_settings(cfg: dict, device: str) -> EvalSettings:
    """A rank's settings: the lab's, as run_gsm8k_parallel wrote them, on this rank's own device."""
    return EvalSettings.from_params(**{**cfg["settings"], "device": device})


def _decode_brief(decode: dict | None) -> dict | None:
    """A rank's decode summary (utils.decode: every generate call's batch, steps, seconds) and its batch sizes."""
    if not decode:
        return None
    return {**decode, "batches": sorted({c["batch"] for c in decode.get("per_call", []) if c.get("batch")})}


def worker_phases(status: dict, launched_at: float, wall: float) -> dict:
    """Where one rank's wall time went, in seconds: start (launch to the worker's code: interpreter, launcher,
    imports), init (process group, GPU cap), load (model and tokenizer), first call (the first generate:
    prefill and, compiled, the compile), the rest of generation, lm-eval's own work (task, prompts, scoring,
    gathering, saving) and the exit (worker done to launcher exit)."""
    gen = status["throughput"]["seconds"]
    first = min((status.get("decode") or {}).get("first_call_s") or 0.0, gen)
    start = status["started_at"] - launched_at
    return {"start": start, "init": status["init_seconds"], "load": status["load_seconds"], "first call": first,
            "generation after it": gen - first, "lm-eval": status["seconds"] - status["load_seconds"] - gen,
            "exit": wall - start - status["init_seconds"] - status["seconds"]}


def _worker(config_path: str) -> int:
    """One rank: run_gsm8k on its share of the problems; status (and rank 0's result) written atomically."""
    entered = time.time()
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    cfg = json.loads(Path(config_path).read_text())
    work = Path(cfg["work"])
    # joins the process group accelerate launch set up, as lm-eval's HFLM would (its timeout: a rank may wait
    # long for a slower one; a rank that dies is the launcher's to stop, a hang the kernel's timeout)
    state = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(weeks=52))])
    rank = state.process_index
    with open(work / f"rank{rank}.log", "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    status = {"rank": rank, "world_size": state.num_processes, "pid": os.getpid(), "state": "started",
              "device": str(state.device), "cap": gpu_cap.kernel_hook(label=f"03_eval-{cfg['label']}-rank{rank}"),
              "started_at": entered}
    t0 = time.time()
    status["init_seconds"] = t0 - entered
    atomic_write_json(work / STATUS.format(rank), status)
    try:
        device = str(state.device) if state.device.type == "cuda" else "cpu"
        s = worker_settings(cfg, device)
        kernel = s.gptq_backend if ev.is_gptq(cfg["model_path"]) else None
        lm = ev.load_lm(cfg["model_path"], device=device, param=s.param, gptq_backend=kernel,
                        **{k: getattr(s, k) for k in LOAD_KEYS})
        attach_ranks(lm)
        status["load_seconds"] = time.time() - t0
        run = ev.run_gsm8k(cfg["model_path"], cfg["out_dir"], label=cfg["label"], data_files=cfg["data_files"],
                           settings=s, lm=lm)
    except BaseException as exc:  # noqa: BLE001 - the launcher must learn which rank failed, and why
        status.update(state="failed", error=f"{type(exc).__name__}: {str(exc).strip()[:1500]}",
                      traceback=traceback.format_exc()[-4000:], seconds=time.time() - t0, **gpu_cap.peaks())
        atomic_write_json(work / STATUS.format(rank), status)
        raise
    if rank == 0:
        atomic_write_json(work / RESULT, run)
    decode = run["settings"]["decode"] if rank == 0 else run.get("decode")
    status.update(state="done", seconds=time.time() - t0, throughput=run["throughput"], decode=_decode_brief(decode),
                  **gpu_cap.peaks())
    atomic_write_json(work / STATUS.format(rank), status)
    return 0


def _leave(rc: int) -> None:
    """Files written, leave without the interpreter's teardown: seconds each launch pays (scripts/launch_costs.py)."""
    gpu_cap.write_final_peaks()
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    _leave(_worker(sys.argv[1]))
