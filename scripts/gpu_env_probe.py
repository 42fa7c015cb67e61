"""The device check's environment probe (gpu_check.py `environment_record`), one interpreter
start: versions, the GPU, and whether sgl_kernel and flashinfer import; one JSON line."""

import json
import sys
r = {"python": sys.version.split()[0]}
for name in ("torch", "triton", "transformers"):
    try:
        r[name] = __import__(name).__version__
    except Exception as e:
        r[name] = f"absent ({e})"
try:
    import torch
    d = torch.cuda.is_available()
    r["torch_cuda"] = torch.version.cuda
    r["gpu"] = torch.cuda.get_device_name(0) if d else None
    r["capability"] = list(torch.cuda.get_device_capability(0)) if d else None
except Exception as e:
    r["gpu"] = f"error ({e})"
for name in ("sgl_kernel", "flashinfer"):
    try:
        __import__(name)
        r[name] = "installed"
    except Exception as e:
        r[name] = f"absent ({type(e).__name__}: {e})"
print(json.dumps(r))
