r"""Generate from a trained run: the latest checkpoint, its config and its tokenizer.

    python -m transformer.generate --workdir runs/lm_s --prompt "The keys to the cabinet"
    python -m transformer.generate --workdir runs/lm_s --prompt "The" --temperature 0.8 \
        --top_p 0.95 --seed 1
    python -m transformer.generate --workdir runs/s2s_reverse --prompt "abcdef" --beam_size 4
    python -m transformer.generate --workdir runs/lm_s --prompt "The" --cache_dtype bfloat16

A decoder continues BOS + the prompt; an encoder-decoder encodes the prompt + EOS (as the
seq2seq data does) and decodes from BOS. Generation stops at EOS or after --max_new_tokens.
Prints the continuation only (stdout), so it can be piped; timing goes to the log.
--cache_dtype bfloat16 stores the KV cache in half the memory (model.cache_dtype).
"""

import os
import time

from absl import flags, logging

from transformer import cli
from transformer.inference import beam_search, decode
from transformer.model import models
from transformer.training import checkpoint, init_from


def continuation(workdir: str, prompt: str, *, max_new_tokens: int = 64,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 beam_size: int = 1, length_penalty: float = 0.6, seed: int = 0,
                 step: int | None = None, cache_dtype: str = "") -> str:
  """The generated text for one prompt (everything the CLI does but printing)."""
  # Settings are checked before the (slow) restore, so a typo fails at once.
  sampling = decode.Sampling(temperature, top_k, top_p)
  if beam_size < 1:
    raise ValueError(f"--beam_size must be >= 1, got {beam_size}.")
  if beam_size > 1 and (temperature or top_k or top_p < 1):
    raise ValueError("beam search is deterministic: drop --temperature/--top_k/--top_p or "
                     "use --beam_size=1.")
  if not prompt:
    raise ValueError("empty --prompt: give some text to condition on.")
  if not length_penalty >= 0:  # NaN too
    raise ValueError(f"--length_penalty must be >= 0 (0 = none), got {length_penalty}.")
  if cache_dtype and cache_dtype not in models.DTYPES:
    raise ValueError(f"--cache_dtype {cache_dtype!r}: use one of {list(models.DTYPES)}.")
  check_workdir(workdir)
  _, model_config, params, tokenizer = checkpoint.load_for_inference(workdir, step)
  if cache_dtype:  # a compute key: any checkpoint decodes with any cache dtype
    model_config.cache_dtype = cache_dtype
  decode.check_model(model_config)
  model = models.make_model(model_config)
  text_ids = tokenizer.encode(prompt)
  if model_config.kind == "encoder_decoder":
    prompts, encoder_inputs = [[tokenizer.bos_id]], [text_ids + [tokenizer.eos_id]]
  else:
    prompts, encoder_inputs = [[tokenizer.bos_id] + text_ids], None

  start = time.perf_counter()
  if beam_size > 1:
    tokens_BWT, _ = beam_search.beam_search(model, params, prompts, max_new_tokens=max_new_tokens,
                                       beam_size=beam_size, length_penalty_alpha=length_penalty,
                                       eos_id=tokenizer.eos_id, encoder_inputs=encoder_inputs)
    new = tokens_BWT[0, 0]
  else:
    new = decode.generate(model, params, prompts, max_new_tokens=max_new_tokens,
                          sampling=sampling, seed=seed, stop_tokens=(tokenizer.eos_id,),
                          encoder_inputs=encoder_inputs)[0]
  new = list(new)
  if tokenizer.eos_id in new:
    new = new[:new.index(tokenizer.eos_id)]
  logging.info("%d tokens in %.2fs (compilation included)", len(new),
               time.perf_counter() - start)
  return tokenizer.decode(new)


def check_workdir(workdir: str) -> None:
  """A --workdir that is missing, a file, or a Hugging Face directory, in one line (the
  checkpoint reader would say only that it found no checkpoint under it)."""
  if not os.path.exists(workdir):
    raise FileNotFoundError(f"--workdir {workdir} does not exist; give a run directory the "
                            f"train or convert command wrote")
  if not os.path.isdir(workdir):
    raise NotADirectoryError(f"--workdir {workdir} is a file; give a run directory")
  if (not os.path.isdir(os.path.join(workdir, "checkpoints"))
      and os.path.isfile(os.path.join(workdir, "config.json"))):
    init_from.read_run_config(workdir, "--workdir")  # a Hugging Face directory: convert it


def define_flags() -> None:
  # Only when run as a program: absl flags are process-global, and train.py (imported by
  # the same test process) defines --workdir too.
  flags.DEFINE_string("workdir", None, "Training workdir (holds checkpoints/).")
  flags.DEFINE_string("prompt", None, "Text to continue (decoder) or transform "
                      "(encoder-decoder).")
  flags.DEFINE_integer("max_new_tokens", 64, "Most tokens to generate.")
  flags.DEFINE_float("temperature", 0.0, "0 = greedy; > 0 samples.")
  flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens (0 = off).")
  flags.DEFINE_float("top_p", 1.0, "Nucleus: the smallest set with this much probability "
                     "(1 = off).")
  flags.DEFINE_integer("beam_size", 1, "> 1: beam search (deterministic) instead of sampling.")
  flags.DEFINE_float("length_penalty", 0.6, "Beam search: GNMT length penalty alpha.")
  flags.DEFINE_integer("seed", 0, "Sampling seed (same seed, same sample).")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
  flags.DEFINE_string("cache_dtype", "", "KV cache dtype: float32, bfloat16 (half the memory) "
                      "or float16 (default: the model's dtype).")


def main(argv):
  del argv
  f = flags.FLAGS
  print(continuation(f.workdir, f.prompt, max_new_tokens=f.max_new_tokens,
                     temperature=f.temperature, top_k=f.top_k, top_p=f.top_p,
                     beam_size=f.beam_size, length_penalty=f.length_penalty, seed=f.seed,
                     step=f.step, cache_dtype=f.cache_dtype))


def run():
  """The `transformer-generate` console script. The continuation is the output: orbax logs
  every restore at INFO and warns about the read-only manager it is asked for, so only
  errors are shown (--verbosity=0 shows all of it)."""
  define_flags()
  cli.run(main, required=("workdir", "prompt"), verbosity=logging.ERROR)


if __name__ == "__main__":
  run()
