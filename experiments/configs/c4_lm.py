r"""C4 language modeling (the paper's Fig. 6): decoder-only softmax vs linear attention vs HYLA.

Arguments (`--config=experiments/configs/c4_lm.py:model=hyla,size=50m`):
  model  any preset of `hypernet_attention.presets.PRESETS` (softmax, linear, hyla, ...).
  size   50m    the paper's model: 6 layers, D=512, 8 heads of 64, MLP 2048 (GeLU), RoPE,
                causal, bfloat16 compute / float32 params, no attention dropout, untied
                input embedding and read-out over the 32k SentencePiece C4 vocabulary:
                51,715,328 parameters (see PARAMS below). Batch 256 x 512 tokens,
                AdamW lr 1e-3, wd 0.1, warmup 1000, cosine to 0.1x over 992,000 steps
                (130B tokens, the paper's budget). Data: TFDS c4/en under
                --config.task.data_dir (a gs:// bucket or a folder; `tfds build c4/en
                --data_dir=DIR` makes it). Hardware: a TPU pod / GPU cluster (the paper:
                72-100 h on 16 TPU v5e). Expected (Fig. 6, no numbers published): HYLA
                beats linear attention and comes close to softmax.
         local  minutes on a 2-core CPU: `text_lm` on ~4 MB of docstrings of the installed
                packages (no download), a 1,024-piece vocabulary trained on them, a 2-layer
                D=128 model (4 heads of 32, MLP 512; 659,968 params), batch 16 x 128
                tokens, 600 steps (1.2M tokens), lr 3e-3.
         smoke  a few seconds, for tests (they set the data files and vocabulary).

Commands:
  python experiments/c4_lm.py --config=experiments/configs/c4_lm.py:model=hyla,size=50m \
    --config.task.data_dir=gs://BUCKET/tensorflow_datasets --workdir=gs://BUCKET/c4_hyla
  python experiments/c4_lm.py --config=experiments/configs/c4_lm.py:model=hyla,size=local

PARAMS (size=50m, vocabulary of V=32,000 pieces, E=512, L=6, M=2048):
  embedding V*E = 16,384,000; per layer 4*(E*E+E) attention + (E*M+M + M*E+E) MLP + 4*E
  norms = 3,152,384, x6 = 18,914,304; final norm 2*E = 1,024; read-out E*V+V = 16,416,000.
  Untied total 51,715,328; tied (read-out = embedding^T) 35,299,328. We untie: the paper
  says ~50M, which only the untied model is (tied is 35M), and NanoDo, whose defaults the
  paper's C4 setup follows, unties by default. Softmax, linear and HYLA have the same count."""

import ml_collections

from hypernet_attention.runs import config_common

SIZES = ("50m", "local", "smoke")
# T5's public 32k SentencePiece model trained on C4 (pad=0, eos=1, unk=2); 32,000 pieces.
C4_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"


def get_config(arg=None) -> ml_collections.ConfigDict:
  arg = config_common.parse_arg(arg, {"size": SIZES}, model="hyla", size="local")
  c = config_common.base_config(experiment="c4_lm")
  c.task = ml_collections.ConfigDict(dict(
      # The data path: 'seqio' (tf.data; TensorFlow, the [lm] extra) or 'grain' (no
      # TensorFlow, the [grain] extra; c4/en built with --file_format=array_record).
      pipeline="seqio",
      name="c4_lm",  # c4_lm (TFDS c4/en under data_dir) or text_lm (train/validation_files)
      data_dir="",  # TFDS data_dir holding c4/en: a folder or gs:// bucket.
      train_files="", validation_files="",  # text_lm: comma-separated globs, .txt / .jsonl
      # > 0: text_lm on this many MB of docstrings of the installed packages, written to
      # {workdir}/corpus/ (tasks/docstring_corpus.py); overrides the *_files.
      docstring_corpus_mb=0.0,
      # A SentencePiece .model; '' trains one of `vocab_size` pieces on the first
      # `vocab_documents` training documents into {workdir}/vocabulary.model.
      vocabulary=C4_VOCABULARY, vocab_size=32_000, vocab_documents=200_000, sequence_length=512))
  c.model = config_common.model_config(
      arg.model, num_layers=6, emb_dim=512, num_heads=8, qk_dim=512, v_dim=512,
      mlp_dim=2048, position="rope", causal=True, attention_dropout=0.0,
      dtype="bfloat16", tied_embedding=False, max_len=512)
  c.update(batch_size=256, num_train_steps=992_000,  # x 256 x 512 = 130B tokens.
           steps_per_loop=100, log_every_steps=1000, eval_every_steps=10_000,
           checkpoint_every_steps=5000)
  c.optimizer.update(learning_rate=1e-3, weight_decay=0.1, warmup_steps=1000)
  # num_problems = validation rows of sequence_length tokens (the first ones, unshuffled).
  c.eval.update(splits=("validation",), num_problems=2048, batch_size=256)

  if arg.size == "local":
    c.task.update(name="text_lm", docstring_corpus_mb=4.0, vocabulary="", vocab_size=1024,
                  sequence_length=128)
    c.model.update(num_layers=2, emb_dim=128, num_heads=4, qk_dim=128, v_dim=128,
                   mlp_dim=512, dtype="float32", max_len=128)
    c.update(batch_size=16, num_train_steps=600, steps_per_loop=50, log_every_steps=50,
             eval_every_steps=200, checkpoint_every_steps=200)
    c.optimizer.update(learning_rate=3e-3, warmup_steps=50)
    c.eval.update(num_problems=128, batch_size=32)
  elif arg.size == "smoke":
    c.task.update(name="text_lm", vocabulary="", vocab_size=512, vocab_documents=1000,
                  sequence_length=16)
    c.model.update(num_layers=2, emb_dim=32, num_heads=4, qk_dim=32, v_dim=32, mlp_dim=64,
                   dtype="float32", max_len=16)
    config_common.use_smoke_schedule(c)
  return c.lock()
