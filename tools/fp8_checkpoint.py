"""Write a block-FP8 copy of a checkpoint directory, in the format DeepSeek-V3/R1 and Qwen3-*-FP8 ship.

    python -m tools.fp8_checkpoint SRC DST [--block-size 128]

Every tensor that `BlockFP8.is_quantized` names becomes float8_e4m3fn ``X.weight`` beside a float32
``X.weight_scale_inv`` [ceil(out / b), ceil(in / b)] (scale = block amax / 448, as DeepSeek's
quantizer); every other tensor is copied in its own dtype. config.json gains the
``quantization_config`` DeepSeek ships (`block_fp8_config`); tokenizer, chat-template and generation
files are copied. One model.safetensors, or, for a sharded source, the same shards (each scale in its
weight's shard) and a model.safetensors.index.json. SRC may also be a tiny catalog name
(``deepseek-r1-tiny``): its shipped checkpoint. Tests use it to get a real FP8 directory of the tiny
models; ragged blocks (dims that the block size does not divide) occur at the default block size.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from disaggsdk.errors import ModelError

# files of a Hugging Face checkpoint directory, besides the weights and config.json, that a loader reads
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "generation_config.json", "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt",
              "tokenizer.model")


def write_fp8_checkpoint(source: Path, destination: Path, block_size: int = 128) -> dict[str, int]:
    """Write the block-FP8 copy of checkpoint ``source`` into ``destination`` (created; must be empty).

    Args:
        source: a Hugging Face checkpoint directory (config.json and safetensors), unquantized.
        destination: where the copy goes.
        block_size: rows and columns one scale covers (128 in DeepSeek's and Qwen's releases).
    Returns:
        Counts: ``quantized`` tensors, ``kept`` tensors (unquantized), ``bytes`` of safetensors written.
    Raises:
        ModelError: ``source`` has no config.json, is quantized already, or ``destination`` is not empty.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from disaggsdk.engine.fp8_blocks import quantize_blocks
    from disaggsdk.engine.weights import checkpoint_files
    from disaggsdk.models.quantization import block_fp8_config, block_fp8_of, scale_name

    config_path = source / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{source} has no config.json; pass a Hugging Face checkpoint directory")
    config = json.loads(config_path.read_text())
    if config.get("quantization_config"):
        raise ModelError(f"{source} is quantized already (config.json has a quantization_config); pass an "
                         f"unquantized (bfloat16/float32) checkpoint")
    if block_size < 1:
        raise ModelError(f"--block-size must be positive, got {block_size}")
    if destination.exists() and any(destination.iterdir()):
        raise ModelError(f"{destination} is not empty; pass a new directory")
    destination.mkdir(parents=True, exist_ok=True)
    quant_config = block_fp8_config(block_size)
    fmt = block_fp8_of({"quantization_config": quant_config})
    assert fmt is not None

    files = checkpoint_files(source)
    sharded = (source / "model.safetensors.index.json").is_file()
    counts = {"quantized": 0, "kept": 0, "bytes": 0}
    total_tensor_bytes = 0  # the index's metadata.total_size: tensor bytes, headers left out
    weight_map: dict[str, str] = {}
    for path in sorted(set(files.values())):
        out: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if fmt.is_quantized(name, tuple(tensor.shape)):
                    out[name], out[scale_name(name)] = quantize_blocks(tensor, (block_size, block_size))
                    counts["quantized"] += 1
                else:
                    out[name] = tensor
                    counts["kept"] += 1
        target = destination / path.name
        save_file(out, str(target), metadata={"format": "pt"})
        counts["bytes"] += target.stat().st_size
        total_tensor_bytes += sum(t.numel() * t.element_size() for t in out.values())
        weight_map.update({name: path.name for name in out})
    if sharded:
        index = {"metadata": {"total_size": total_tensor_bytes},
                 "weight_map": dict(sorted(weight_map.items()))}
        (destination / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (destination / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config},
                                                        indent=2, sort_keys=True) + "\n")
    for name in SIDE_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, destination / name)
    return counts


def main(argv: list[str] | None = None) -> None:
    """The command line: ``python -m tools.fp8_checkpoint SRC DST [--block-size 128]``."""
    from disaggsdk.models.shipped import checkpoint_directory

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="checkpoint directory, or a tiny catalog name (its shipped checkpoint)")
    p.add_argument("destination", type=Path)
    p.add_argument("--block-size", type=int, default=128, help="rows and columns per scale (default 128)")
    args = p.parse_args(argv)
    source = checkpoint_directory(args.source)
    if source is None:
        raise SystemExit(f"{args.source!r} has no checkpoint on this machine")
    try:
        counts = write_fp8_checkpoint(source, args.destination, args.block_size)
    except ModelError as exc:
        raise SystemExit(str(exc)) from None
    print(f"{args.destination}: {counts['quantized']} tensors in block fp8 ({args.block_size}x{args.block_size}), "
          f"{counts['kept']} kept, {counts['bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
