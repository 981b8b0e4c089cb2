"""Why the compiled ViT (problems/level3/011) missed the fp32 rule: compile it under one setting
(argv[1]) and print one JSON line: the compiled and the eager fp32 outputs' max abs error
against fp64, and the compile's seconds. Settings: as-is (torch's defaults: cuDNN TF32 on),
cudnn-tf32-off, conv-aten (Inductor's convolutions through ATen only), no-pattern (Inductor's
pattern matcher off), default-mode (mode "default"; the others are
max-autotune-no-cudagraphs)."""
import importlib.util
import json
import sys
import time

import torch
import torch._inductor.config as inductor_config

PROBLEM = "problems/level3/011_vit_patch_embed_encoder_fp32.py"


def load():
    spec = importlib.util.spec_from_file_location("vit", PROBLEM)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(setting):
    mode = "max-autotune-no-cudagraphs"
    if setting == "cudnn-tf32-off":
        torch.backends.cudnn.allow_tf32 = False
    elif setting == "conv-aten":
        inductor_config.max_autotune_conv_backends = "ATEN"
    elif setting == "no-pattern":
        inductor_config.pattern_matcher = False
    elif setting == "default-mode":
        mode = "default"
    elif setting != "as-is":
        raise SystemExit(f"unknown setting {setting!r}")
    p = load()
    torch.manual_seed(0)
    model = p.Model(*p.get_init_inputs()).cuda().eval()
    xs = [t.cuda() for t in p.get_inputs()]
    with torch.no_grad():
        ref64 = model.double()(*[t.double() for t in xs])
        model.float()
        eager = model(*xs)
        t0 = time.time()
        out = torch.compile(model, mode=mode)(*xs)
        seconds = time.time() - t0
    print(json.dumps({"setting": setting, "mode": mode, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
                      "eager_err": (eager.double() - ref64).abs().max().item(),
                      "compiled_err": (out.double() - ref64).abs().max().item(),
                      "compiled_vs_eager": (out - eager).abs().max().item(), "compile_s": round(seconds, 1)}))


if __name__ == "__main__":
    main(sys.argv[1])
