"""Published architectures as model configs (inspect, convert, train from scratch).

Their dtypes: float32 compute and weights (model_config's defaults) unless a preset says
otherwise; the Llama 3 presets are bfloat16 throughout, the released weights' storage, for
inspection, conversion and inference. Training on a GPU/TPU wants schema.PRECISIONS["bf16"]
(bfloat16 compute on float32 weights and optimizer state): model.update(precision_config("bf16")).
"""
