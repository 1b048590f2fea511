"""Text from a trained GPT: autoregressive sampling, one token at a time.

Each new token is drawn from the model's next-token distribution given the last ``seq_len``
tokens (the context the model was trained on), with a temperature: 0 takes the most likely
token (greedy), 1 samples the model's distribution as it is, between them sharpens it. No KV
cache: the whole context is run again for each token, as nanoGPT's ``generate`` does.
"""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def generate(gpt: nn.Module, prompt: torch.Tensor, new_tokens: int, temperature: float = 1.0,
             seed: int = 0) -> torch.Tensor:
    """``prompt`` (a 1-D tensor of token ids, at least one) followed by ``new_tokens`` sampled
    tokens; deterministic for a seed."""
    if prompt.ndim != 1 or len(prompt) == 0:
        raise ValueError(f"the prompt must be a non-empty 1-D tensor of token ids, got shape "
                         f"{tuple(prompt.shape)}")
    if temperature < 0 or new_tokens < 0:
        raise ValueError(f"temperature and new tokens must be >= 0, got {temperature} and "
                         f"{new_tokens}")
    device = next(gpt.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = prompt.to(device).unsqueeze(0)
    was_training = gpt.training
    gpt.eval()
    for _ in range(new_tokens):
        logits = gpt(tokens[:, -gpt.config.seq_len:])[0, -1].float()
        if temperature == 0:
            chosen = logits.argmax().view(1)
        else:
            chosen = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1,
                                       generator=generator)
        tokens = torch.cat([tokens, chosen.view(1, 1)], dim=1)
    gpt.train(was_training)
    return tokens[0].cpu()
