"""A masks sanitize script (tools/gpu/masks_sanitize.py, masks_bwd_sanitize.py) with build switches on the masked
kernels that the public ops launch: a candidate is sanitized through the same public calls before it is the default.
LAB_FWD_DEFINES / LAB_BWD_DEFINES (JSON) are added to every lab.masks.op.launch / lab.masks.backward.launch_backward
call; name every switch as tools/gpu/masks_softcap_ab.py does, so that the build is the one its A/B timed and checked.
    LAB_FWD_DEFINES='{"LAB_FWD_MASK_SOFTCAP": 2}' compute-sanitizer ... python3 tools/gpu/masks_sanitize_with.py \
        tools/gpu/masks_sanitize.py
"""
import inspect
import json
import os
import runpy
import sys

from lab.masks import backward as mbwd, op as mop


def with_defines(fn, defines: dict):
    signature = inspect.signature(fn)

    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["defines"] = {**(bound.arguments.get("defines") or {}), **defines}
        return fn(*bound.args, **bound.kwargs)
    return wrapped


for env, module, name in (("LAB_FWD_DEFINES", mop, "launch"), ("LAB_BWD_DEFINES", mbwd, "launch_backward")):
    if os.environ.get(env):
        defines = json.loads(os.environ[env])
        setattr(module, name, with_defines(getattr(module, name), defines))
        print(f"{module.__name__}.{name} with {defines}", flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
