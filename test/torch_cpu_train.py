# The PyTorch peer of `./train` on the CPU (make bench, row 3): the same model trained on the same batches.
# `./train --batches-out FILE` writes the model's shape and every batch it trained on (token ids); this
# builds that model from torch.nn's Transformer layers (post-LN, or pre-LN with final LayerNorms; tied
# embeddings x sqrt(d_model), sinusoidal positions; dropout on the embeddings, residuals, attention weights
# and ReLU with the file's probabilities; label-smoothed cross-entropy; Adam with Eq. 3's schedule), trains
# it on those batches in their order, a step being the batches of one step number, and prints one line:
#   TRAIN torch=VERSION threads=N steps=N tgt_tok_per_s=X
# X is the mean of each step's target tokens / seconds over all steps but the first, as make bench reads
# ./train's log.csv. fp32, torch's default threads (all cores).
# Usage: python3 test/torch_cpu_train.py FILE
import math, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

def read(path):
    try:
        return parse(path)
    except OSError as e:
        sys.exit(f"torch_cpu_train: cannot read {path}: {e.strerror}")
    except (ValueError, RuntimeError) as e:  # a line that is not what --batches-out writes
        sys.exit(f"torch_cpu_train: {path} is not a --batches-out file ({e})")

def parse(path):
    with open(path) as f:
        head = f.readline().split()
        if not head or head[0] != "model":
            sys.exit(f"torch_cpu_train: {path} does not start with a model line (write it with ./train --batches-out)")
        cfg = {k: float(v) for k, v in (kv.split("=") for kv in head[1:])}
        steps = []
        while True:
            line = f.readline()
            if not line:
                break
            _, step, B, S, T = line.split()
            B, S, T = int(B), int(S), int(T)
            ids = [torch.tensor([int(x) for x in f.readline().split()], dtype=torch.long) for _ in range(3)]
            batch = (ids[0].view(B, S), ids[1].view(B, T), ids[2].view(B, T))
            if steps and steps[-1][0] == step:
                steps[-1][1].append(batch)
            else:
                steps.append((step, [batch]))
    return cfg, steps

class Model(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.c = c
        D, H, Fd, N, V = int(c["D"]), int(c["H"]), int(c["F"]), int(c["N"]), int(c["V"])
        s.emb = nn.Embedding(V, D)
        nn.init.normal_(s.emb.weight, 0, D ** -0.5)
        pos = torch.arange(int(c["max_len"])).unsqueeze(1)
        div = torch.exp(torch.arange(0, D, 2) * (-math.log(10000.0) / D))
        pe = torch.zeros(int(c["max_len"]), D)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        s.register_buffer("pe", pe)
        s.drop = nn.Dropout(c["p_drop"])
        pre = bool(c["pre_ln"])
        kw = dict(d_model=D, nhead=H, dim_feedforward=Fd, dropout=c["p_drop"], batch_first=True, norm_first=pre,
                  layer_norm_eps=c["ln_eps"])
        s.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), N, norm=nn.LayerNorm(D, eps=c["ln_eps"]) if pre else None,
                                      enable_nested_tensor=False)
        s.dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), N, norm=nn.LayerNorm(D, eps=c["ln_eps"]) if pre else None)
        for layer in list(s.enc.layers) + list(s.dec.layers):  # torch's one dropout, split as the file says
            layer.self_attn.dropout = c["p_attn"]
            if hasattr(layer, "multihead_attn"):
                layer.multihead_attn.dropout = c["p_attn"]
            layer.dropout.p = c["p_relu"]  # after the feed-forward network's ReLU

    def embed(s, x):
        return s.drop(s.emb(x) * math.sqrt(s.c["D"]) + s.pe[: x.size(1)])

    def forward(s, src, tgt_in):
        pad = int(s.c["pad"])
        T = tgt_in.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # True: a later position, not attended to
        memory = s.enc(s.embed(src), src_key_padding_mask=(src == pad))
        h = s.dec(s.embed(tgt_in), memory, tgt_mask=causal, tgt_key_padding_mask=(tgt_in == pad),
                  memory_key_padding_mask=(src == pad))
        return h @ s.emb.weight.t()

def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torch_cpu_train.py FILE (written by ./train --batches-out FILE)")
    c, steps = read(sys.argv[1])
    if len(steps) < 2:
        sys.exit(f"torch_cpu_train: {sys.argv[1]} has {len(steps)} steps; at least 2 are needed (the first is a warm-up)")
    torch.manual_seed(0)
    m = Model(c)
    opt = torch.optim.Adam(m.parameters(), lr=1.0, betas=(c["beta1"], c["beta2"]), eps=c["adam_eps"])
    D, warmup, pad, V = c["D"], c["warmup"], int(c["pad"]), int(c["V"])
    rates = []
    for n, (_, batches) in enumerate(steps, start=1):
        t = time.perf_counter()
        tokens = sum(int((out != pad).sum()) for _, _, out in batches)
        opt.zero_grad(set_to_none=True)
        for src, tgt_in, tgt_out in batches:  # gradients summed over the step's batches, normalised by its tokens
            logits = m(src, tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, V), tgt_out.reshape(-1), ignore_index=pad,
                                   label_smoothing=c["eps_ls"], reduction="sum") / tokens
            loss.backward()
        for g in opt.param_groups:  # [Eq. 3]
            g["lr"] = c["lr_scale"] * D ** -0.5 * min(n ** -0.5, n * warmup ** -1.5)
        opt.step()
        if n > 1:
            rates.append(tokens / (time.perf_counter() - t))
    print(f"TRAIN torch={torch.__version__} threads={torch.get_num_threads()} steps={len(steps)} "
          f"tgt_tok_per_s={sum(rates) / len(rates):.0f}")

main()
