"""GPU time of the RMSNorm-rows pre-pass (the rows' fp32 L2 norms of x [M, K] bf16): the op's
row_norms (gen.runtime.rownorm) against torch.linalg.vector_norm(dtype=float32) (the op's pre-pass before it), other
torch forms and one-row-per-program Triton kernels at other block sizes (errors against float64), and the op's
RMSNorm tax (linear with rms_eps against without; with rms_eps, also with the norms from vector_norm, as it was) at
decode to prefill M, for the K, N of Llama-3-8B's and Qwen2.5-7B's QKV and a 8192-wide layer. Each figure: a CUDA graph of 20 calls replayed,
CUDA events, the median of 7 replays (GPU time; host time excluded).

    python bench/rms_prepass.py bench/results/rms-prepass-<device>.json      (GPU)
"""
import json, os, sys, time
import torch, triton, triton.language as tl
sys.path.insert(0, os.getcwd())


@triton.jit
def row_norms_kernel(x_ptr, out_ptr, K, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for k in range(0, K, BLOCK):
        offs = k + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride + offs, mask=offs < K, other=0.0).to(tl.float32)
        acc += v * v
    tl.store(out_ptr + row, tl.sqrt(tl.sum(acc, 0)))


def triton_norms(x, block=1024, warps=4):
    out = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
    row_norms_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=block, num_warps=warps)
    return out


def vector_norm_rows(x):
    return torch.linalg.vector_norm(x, dim=1, dtype=torch.float32)


def gpu_time(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / reps * 1e3)
    ts.sort()
    return ts[3]


def main():
    out = sys.argv[1]
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "command": "python bench/rms_prepass.py " + os.path.relpath(out), "rows": []}
    import generated.gemm as g
    from generated._runtime.rownorm import row_norms
    for K, N in [(4096, 6144), (3584, 4608), (8192, 10240)]:
        for M in [1, 4, 16, 64, 512, 2048, 8192]:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            ref = torch.linalg.vector_norm(x.double(), dim=1).float()
            row = {"M": M, "K": K, "N": N}
            cands = {
                "vector_norm_dtype": lambda: torch.linalg.vector_norm(x, dim=1, dtype=torch.float32),
                "vector_norm_float": lambda: torch.linalg.vector_norm(x.float(), dim=1),
                "float_square_sum": lambda: x.float().square().sum(1),
                "triton_b1024_w4": lambda: triton_norms(x, 1024, 4),
                "triton_b2048_w8": lambda: triton_norms(x, 2048, 8),
                "triton_b512_w2": lambda: triton_norms(x, 512, 2),
                "gen_row_norms": lambda: row_norms(x),   # the op's pre-pass (its launcher, no binder)
            }
            for name, fn in cands.items():
                try:
                    v = fn()
                    if name != "float_square_sum":
                        err = ((v - ref).norm() / ref.norm()).item()
                        row[name + "_err"] = err
                    row[name] = round(gpu_time(fn), 2)
                except Exception as e:
                    row[name] = f"error {type(e).__name__}: {e}"[:200]
            w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K ** 0.5
            try:
                row["op_plain_us"] = round(gpu_time(lambda: g.linear(x, w)), 2)
                row["op_rms_us"] = round(gpu_time(lambda: g.linear(x, w, rms_eps=1e-5)), 2)
                g.row_norms = vector_norm_rows   # the op as it was: torch's reduction for the norms
                try:
                    row["op_rms_vector_norm_us"] = round(gpu_time(lambda: g.linear(x, w, rms_eps=1e-5)), 2)
                finally:
                    g.row_norms = row_norms
            except Exception as e:
                row["op"] = f"error {type(e).__name__}: {e}"[:300]
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
