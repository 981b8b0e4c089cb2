"""Where `kforge verify`'s prime of torch.compile spends its 7-13 s on a GPU machine
(bench/results/verify-scale/: the largest fixed cost of a verify at the large preset).

    python3 scripts/device/prime_profile.py [OUT.json]

In one fresh process, timed apart: import torch; import torch._dynamo and the Inductor compile
path; CUDA's context (one tensor on the GPU); the prime itself (kforge.verify.runner's
prime_torch_compile, under cProfile); a second prime (what is left once everything is loaded).
Prints the phases and cProfile's 25 largest cumulative entries; writes both to OUT.json."""
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.environ.get("OUT", "/tmp"), "prime_profile.json")
    t = {}
    t0 = time.perf_counter()
    import torch

    t["import torch"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401

    t["import dynamo + inductor"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    t["cuda context"] = time.perf_counter() - t0
    from kforge.verify.runner import prime_torch_compile

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    prime_torch_compile(torch.device("cuda"))
    prof.disable()
    t["prime"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prime_torch_compile(torch.device("cuda"))
    t["prime again"] = time.perf_counter() - t0
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
    json.dump({"seconds": {k: round(v, 3) for k, v in t.items()}, "profile": s.getvalue()}, open(out, "w"), indent=1)
    print(s.getvalue()[-6000:])
    for k, v in t.items():
        print(f"{k:28s} {v:7.2f} s")


if __name__ == "__main__":
    main()
