import re, sys
def kernels(path):
    out, name, body = {}, None, []
    for line in open(path):
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name: out[name] = body
            name, body = m.group(1), []
            continue
        line = re.sub(r"/\*[^*]*\*/", "", line).strip()
        if line and not line.startswith("."): body.append(re.sub(r"\s+", " ", line))
    if name: out[name] = body
    # name key: drop a third WindowSteps bool (the new kTanhHalf argument)
    return {re.sub(r"(WindowStepsILb[01]ELb[01]E)Lb[01]E", r"\1", n): b for n, b in out.items()}
b0, b1, n0, n1 = (kernels(f + ".sass") for f in ("base0", "base1", "new0", "new1"))
def same(a, b, pick, label):
    names = [n for n in a if pick(n)]
    diff = [n for n in names if a[n] != b.get(n)]
    print(f"{label}: {len(names) - len(diff)}/{len(names)} kernels identical SASS" + (f"; differ: {diff}" if diff else ""))
fp16 = lambda n: "6__half" in n
bf16 = lambda n: "__nv_bfloat16" in n
same(n1, b0, fp16, "default build (TANH_HALF=1), fp16 kernels vs base f32-tanh build")
same(n1, b1, bf16, "default build (TANH_HALF=1), bf16 kernels vs base TANH_HALF=1 build")
same(n1, b0, bf16, "default build (TANH_HALF=1), bf16 kernels vs base f32-tanh build (softcap ones must differ)")
same(n0, b0, lambda n: True, "TANH_HALF=0 build vs base f32-tanh build, every kernel")
