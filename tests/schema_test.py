"""transformer/schema.py: the flat view of nested configs that summaries and diffs use."""

from transformer import schema


def test_flatten_joins_nested_keys_with_dots():
  assert schema.flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {
      "a.b": 1, "a.c.d": 2, "e": 3}


def test_flatten_keeps_every_leaf_of_a_config():
  config = schema.experiment_config(schema.model_config(), {"name": "grammar_corpus"},
                                    schema.objective_config("lm"))
  nested = config.to_dict()
  flat = schema.flatten(nested)
  for key, value in flat.items():  # every flat key walks back to its leaf
    node = nested
    for part in key.split("."):
      node = node[part]
    assert node == value
  assert flat["model.d_model"] == config.model.d_model
