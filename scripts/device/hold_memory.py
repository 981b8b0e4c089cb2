"""A job that needs GPU memory: allocates GIB GiB on the GPU, touches it, holds it for HOLD_S
seconds (the job's work), then prints one JSON line. A CUDA out-of-memory error propagates, as a
candidate's would.

    python3 hold_memory.py GIB HOLD_S
"""

import json
import sys
import time

import torch


def main() -> None:
    gib, hold_s = float(sys.argv[1]), float(sys.argv[2])
    t0 = time.time()
    x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    time.sleep(hold_s)
    ok = bool(x[-1].item() == 1)
    print(json.dumps({"gib": gib, "ok": ok, "seconds": round(time.time() - t0, 2)}))


if __name__ == "__main__":
    main()
