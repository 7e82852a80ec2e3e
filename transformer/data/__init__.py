"""Data: built-in TFDS datasets, tokenizers and the grain input pipeline.

    data_config = data.default_config()
    tokenizer = data.get_tokenizer(data_config, workdir)
    it = data.make_iterator(data_config, tokenizer, split="train", batch_size=8,
                            objective="lm", seed=0)
    batch = next(it)  # dict of numpy arrays [8, data_config.seq_len]
"""

from transformer.data.algorithmic import TASKS
from transformer.data.builders import BUILDERS, SIZES
from transformer.data.grammar import AgreementProbe, SenseProbe, agreement_probes, sense_probes
from transformer.data.grammar_floor import loss_floor
from transformer.data.kv_retrieval import items as kv_items
from transformer.data.featurize import OBJECTIVES, PROMPT_SEPARATOR
from transformer.data.pipeline import (default_config, iterator_state, make_dataset,
                                       make_iterator, restore_iterator, unigram_entropy, validate)
from transformer.data.sources import built_name, describe, load
from transformer.data.tokenizers import TOKENIZERS, get_tokenizer, token_bytes
