"""The real model, three engines, side by side: SmolLM2-135M-Instruct (the packaged GGUF) in
the builtin engine, in transformers' `generate`, and in vLLM's CPU build (the folder
`engine.model.export` writes), on one machine in one invocation.

    python -m loadtest.bench.models --out DIR [--quick] [--vllm-python .venv-vllm/bin/python]

Each measurement runs in a process of its own (its own torch threads, Gloo world and peak
RSS), one after another, each pinned to one core with one torch thread, so the engines get the
same machine. Reported per engine and tensor-parallel size: load time, peak RSS per rank, TTFT
for a 200-token prompt, and decode tokens/s at batch 1 and 8 (greedy, EOS ignored, the
prefill's time excluded), each the best of `ROUNDS` runs. The builtin engine runs twice per
size, by how it stores the matrices: float32 (exact to the file, as transformers and vLLM run
here), float16, and gguf (the file's own Q4_1/Q8_0 blocks through the fused kernel: what
`make run` serves); the arithmetic is float32 in all three. transformers has no tensor
parallelism on CPU; vLLM's needs the head counts to divide (9 query and 3 KV heads do not
split in two), so both are TP=1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.base.ports import free_port
from loadtest.bench.machine import machine_facts

QUESTION = [
    {"role": "user", "content": "I need running shoes for flat feet. What should I look for?"}
]
PROMPT_TOKENS = 200  # the TTFT prompt
BATCHES = (1, 8)
ROUNDS = 3  # each figure is the best of this many (a shared 2-core VM varies by +-30%)
WEIGHTS = ("float32", "float16", "gguf")  # the builtin engine's stored matrices (--weight-dtype)
ROOT = Path(__file__).resolve().parents[2]
_MARK = "unitgate-bench-result "  # a job's result line (vLLM prints on stdout as well)


def _prompts() -> tuple[list[int], list[int]]:
    """(the chat-templated question, a 200-token prompt), by the engine's own tokenizer."""
    from engine.model.gguf import GGUFFile, gguf_tokenizer, packaged_file

    tokenizer = gguf_tokenizer(GGUFFile(packaged_file("smollm2")))
    question = tokenizer.apply_chat_template(QUESTION)
    text = " ".join(["Running shoes for flat feet need support, cushioning and a firm heel."] * 40)
    return question, tokenizer.encode(text)[:PROMPT_TOKENS]


def _peak_rss_mb() -> float:
    """This process's peak (VmHWM), or a reaped child's if larger (vLLM's engine core).

    Not RUSAGE_SELF: Linux carries ru_maxrss across exec, so a job forked from the driver
    (which has just exported the model) would report the driver's peak, not its own."""
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    own = int(line.split()[1])  # kB
    return max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


# -- jobs (each in its own process) --

Generate = Callable[[list[int], int, int], float]  # (prompt ids, batch, new tokens) -> seconds


def _timed(generate: Generate, question: list[int], long: list[int], steps: int) -> dict[str, Any]:
    """TTFT as a one-token generation of the long prompt; decode as the difference between
    `steps + 1` new tokens and one, so the prefill drops out (engines with a generate call)."""
    out: dict[str, Any] = {"ttft_200_ms": min(generate(long, 1, 1) for _ in range(ROUNDS)) * 1e3}
    for batch in BATCHES:
        rounds = []
        for _ in range(ROUNDS):
            first = generate(question, batch, 1)
            rounds.append(generate(question, batch, steps + 1) - first)
        out[f"decode_b{batch}_tok_s"] = batch * steps / min(rounds)
    return out | {"rss_mb": _peak_rss_mb()}


def _builtin(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine.device import weight_dtype
    from engine.model import TPContext
    from engine.model.gguf import GGUFFile, load_gguf, packaged_file
    from engine.runtime.group import destroy_unit_group, init_unit_group

    torch.set_num_threads(1)
    question, long_prompt = _prompts()
    tp = TPContext()
    if args.world > 1:
        tp = TPContext(rank=args.rank, world_size=args.world)
        init_unit_group(args.rank, args.world, args.master, 120.0, 120.0)
    t0 = time.perf_counter()
    model = load_gguf(
        GGUFFile(packaged_file("smollm2")),
        tp,
        num_slots=max(BATCHES),
        max_seq_len=512,
        weight_dtype=weight_dtype(args.weights, torch.float32),
    )
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    ttft = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        int(model([(0, long_prompt, 0)])[0].argmax())
        ttft.append(time.perf_counter() - t0)
    out["ttft_200_ms"] = min(ttft) * 1e3
    for batch in BATCHES:
        rounds = []
        for _ in range(ROUNDS):
            logits = model([(slot, question, 0) for slot in range(batch)])
            tokens = [int(t) for t in logits.argmax(dim=-1)]
            t0 = time.perf_counter()
            for step in range(args.steps):
                pos = len(question) + step
                logits = model([(slot, [tokens[slot]], pos) for slot in range(batch)])
                tokens = [int(t) for t in logits.argmax(dim=-1)]
            rounds.append(time.perf_counter() - t0)
        out[f"decode_b{batch}_tok_s"] = batch * args.steps / min(rounds)
    out["rss_mb"] = _peak_rss_mb()
    if args.world > 1:
        destroy_unit_group()
    return out


def _transformers(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    question, long_prompt = _prompts()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=torch.float32)
    model.train(False)  # inference mode (dropout off), as .eval() would
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0}

    def generate(ids: list[int], batch: int, new: int) -> float:
        inputs = torch.tensor([ids] * batch)
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=2,
            )
        return time.perf_counter() - start

    return out | _timed(generate, question, long_prompt, args.steps)


def _vllm(args: argparse.Namespace) -> dict[str, Any]:
    from engine.backends.vllm.env import apply_defaults, node_defaults

    # What a vLLM node of this project runs with (one core, 1 GiB of KV cache, offline),
    # set before vLLM is imported, which reads it once.
    apply_defaults(node_defaults(0, "127.0.0.1", 120.0), os.environ)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    question, long_prompt = _prompts()
    t0 = time.perf_counter()
    llm = LLM(str(args.folder), dtype="float32", max_model_len=512, enforce_eager=True)
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0}

    def generate(ids: list[int], batch: int, new: int) -> float:
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=ids) for _ in range(batch)]
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    generate(question, 1, 2)  # the first call compiles and warms up
    return out | _timed(generate, question, long_prompt, args.steps)


JOBS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "builtin": _builtin,
    "transformers": _transformers,
    "vllm": _vllm,
}


# -- the driver --


def _job(python: str, job: str, steps: int, folder: Path, cpu: int, **extra: Any) -> Any:
    argv = [python, "-m", "loadtest.bench.models", "--job", job, "--steps", str(steps)]
    argv += ["--folder", str(folder)]
    for key, value in extra.items():
        argv += [f"--{key}", str(value)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cpu))
    return subprocess.Popen(
        ["taskset", "-c", str(cpu), *argv], stdout=subprocess.PIPE, env=env, cwd=ROOT
    )


def _result(proc: subprocess.Popen[bytes], what: str) -> dict[str, Any]:
    stdout, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: exited {proc.returncode}")
    lines = [line for line in stdout.decode().splitlines() if line.startswith(_MARK)]
    if len(lines) != 1:
        raise RuntimeError(f"{what}: printed no result")
    data: dict[str, Any] = json.loads(lines[0].removeprefix(_MARK))
    return data


def group(rank: int, master: str) -> dict[str, Any]:
    return {"rank": rank, "world": 2, "master": master}


def _run_all(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    me, results = sys.executable, {}
    for weights in WEIGHTS:
        name = f"builtin tp1 {weights}"
        print(f"{name} ...", file=sys.stderr)
        results[name] = _result(_job(me, "builtin", args.steps, folder, 0, weights=weights), name)
    for weights in WEIGHTS:
        name = f"builtin tp2 {weights}"
        print(f"{name} ...", file=sys.stderr)
        master = f"127.0.0.1:{free_port()}"
        procs = [
            _job(me, "builtin", args.steps, folder, rank, weights=weights, **group(rank, master))
            for rank in (0, 1)
        ]
        ranks = [_result(p, f"{name} rank {r}") for r, p in enumerate(procs)]
        results[name] = {**ranks[0], "rss_mb": max(r["rss_mb"] for r in ranks)}
    print("transformers TP=1 ...", file=sys.stderr)
    results["transformers tp1"] = _result(
        _job(me, "transformers", args.steps, folder, 0), "transformers"
    )
    if Path(args.vllm_python).exists():
        print("vLLM TP=1 ...", file=sys.stderr)
        results["vllm tp1"] = _result(_job(args.vllm_python, "vllm", args.steps, folder, 0), "vllm")
    return results


def _table(results: dict[str, Any]) -> str:
    rows = [
        "| engine | load s | peak RSS per rank MB | TTFT 200-token prompt ms "
        "| decode tok/s batch 1 | decode tok/s batch 8 |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rows.append(
            f"| {name} | {r['load_s']:.1f} | {r['rss_mb']:.0f} | {r['ttft_200_ms']:.0f} "
            f"| {r['decode_b1_tok_s']:.1f} | {r['decode_b8_tok_s']:.1f} |"
        )
    rows.append("")
    for weights in WEIGHTS:
        ours = results[f"builtin tp1 {weights}"]
        for peer, batch, aim in (("transformers", 1, 2), ("vllm", 8, 1)):
            other = results.get(f"{peer} tp1")
            if other is not None:
                key = f"decode_b{batch}_tok_s"
                rows.append(
                    f"builtin ({weights} weights) / {peer} decode at batch {batch}: "
                    f"{ours[key] / other[key]:.2f}x (aim: >= {aim}x)"
                )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.models", description=__doc__)
    p.add_argument("--out", type=Path, help="write DIR/models.json")
    p.add_argument("--quick", action="store_true", help="8 decode steps instead of 32")
    p.add_argument("--steps", type=int, default=32, help=argparse.SUPPRESS)
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--job", choices=sorted(JOBS), help=argparse.SUPPRESS)
    p.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--master", default="", help=argparse.SUPPRESS)
    p.add_argument("--weights", choices=WEIGHTS, default="float32", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job is not None:
        print(_MARK + json.dumps(JOBS[args.job](args)), flush=True)
        return 0
    if args.quick:
        args.steps = 8
    from tempfile import TemporaryDirectory

    from engine.model.export import main as export

    with TemporaryDirectory(prefix="unitgate-models-") as tmp:
        folder = Path(tmp) / "smollm2-hf"
        if export([str(folder), "--model", "smollm2"]) != 0:
            return 2
        results = _run_all(args, folder)
    print(_table(results))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        data = {"machine": machine_facts(), "steps": args.steps, "results": results}
        (args.out / "models.json").write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
