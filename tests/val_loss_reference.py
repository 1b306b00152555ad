"""The validation loss gtrain reports, computed by transformers on the same tokens: shared by the
export tests (tests/hf/hf_test.py, tests/resume/state_to_hf_test.py). The windows are gtrain's fixed
validation windows (src/core/data.h): batch b takes windows (b*B + i) mod (number of windows)."""
import numpy as np
import torch


def val_loss_reference(model, val_path, B, T, n_batches):
    """gtrain's val_loss for a one-file gtrain shard (mean over all target tokens)."""
    raw = open(val_path, "rb").read()
    tokens = np.frombuffer(raw[32:], dtype="<u2").astype(np.int64)
    nw = (len(tokens) - 1) // T
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(n_batches):
            ws = [(b * B + i) % nw for i in range(B)]
            x = torch.tensor(np.stack([tokens[w * T: w * T + T] for w in ws]))
            y = torch.tensor(np.stack([tokens[w * T + 1: w * T + T + 1] for w in ws]))
            logits = model(input_ids=x).logits.double()
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                       reduction="sum").item()
            count += y.numel()
    return total / count
