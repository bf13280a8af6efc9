r"""Statistics of the synthetic tasks: split sizes, SRAVEN ambiguity and ceilings, speed.

  python experiments/task_stats.py --num_problems=20480 --ceiling_problems=8192

Prints the split sizes of both tasks; the SRAVEN ambiguity rate for K=4 and F in {8, 4}
under our definition ('panel': some reading of the context predicts a different answer
panel) and the authors' ('authors': some reading predicts a different value in every slot),
next to Table A2; per split the accuracy ceiling of uniform guessing among consistent
answers (mean 1/#consistent answers) and the Bayes-optimal accuracy; and
generation speed in batches of 128 per second (jitted, after compile, on this host)."""

import functools
import time

import jax
import numpy as np

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.tasks.fuzzy_logic import FuzzyLogic
from hypernet_attention.tasks.sraven import SRaven

TABLE_A2 = {8: 0.0032, 4: 0.0642}  # K=4 (the paper's Table A2)


def ambiguity_rate(task, key, num_problems, definition, batch_size=2048):
  flags = []
  for step in range(-(-num_problems // batch_size)):
    grid = task.sample(jax.random.fold_in(key, step), batch_size, 'train')['grid']
    flags.append(np.asarray(task.is_ambiguous(grid, definition)))
  flags = np.concatenate(flags)[:num_problems]
  return flags.mean(), flags.std() / np.sqrt(len(flags))


def batches_per_second(sample, batch_size=128, seconds=2.0):
  jax.block_until_ready(sample(jax.random.key(0), batch_size))  # compile
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    jax.block_until_ready(sample(jax.random.key(count), batch_size))
    count += 1
  return count / (time.perf_counter() - start)


def main():
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--num_problems', type=int, default=20480)
  parser.add_argument('--ceiling_problems', type=int, default=8192)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  parser.check_positive(args, 'num_problems', 'ceiling_problems')
  if not 0 <= args.seed < 2**32:
    parser.error(f'--seed={args.seed}; allowed: an integer in [0, 2**32)')
  key = jax.random.key(args.seed)

  sravens = {F: SRaven(num_values=F, seed=args.seed) for F in (8, 4)}
  print('== split sizes')
  for F, task in sravens.items():
    print(f'SRAVEN K=4 F={F}: ' + ', '.join(
        f'{s}={len(task.combinations(s))}' for s in ('train', 'test', 'ood')))
  for fraction in (0.3, 0.5, 0.7):
    task = FuzzyLogic(holdout_fraction=fraction, seed=args.seed)
    print(f'fuzzy logic holdout={fraction}: ' + ', '.join(
        f'{s}={len(task.combinations(s))}' for s in task.splits))

  print(f'== SRAVEN ambiguity, K=4, train split, {args.num_problems} problems')
  for F, task in sravens.items():
    for definition in ('panel', 'authors'):
      start = time.perf_counter()
      rate, se = ambiguity_rate(task, key, args.num_problems, definition)
      print(f'F={F} {definition:8s} rate={rate:.4f} +- {se:.4f}  (Table A2: {TABLE_A2[F]})'
            f'  [{time.perf_counter() - start:.1f}s]')

  print(f'== SRAVEN accuracy ceilings, {args.ceiling_problems} problems: mean 1/#consistent '
        'answers, and the Bayes-optimal accuracy (mean max posterior)')
  for F, task in sravens.items():
    for split in ('train', 'ood'):
      start = time.perf_counter()
      k = jax.random.fold_in(key, 1)
      ceiling = task.accuracy_ceiling(k, args.ceiling_problems, split)
      bayes = task.bayes_accuracy(k, args.ceiling_problems, split)
      bayes_all = task.bayes_accuracy(k, args.ceiling_problems, split, prior='all')
      print(f'F={F} {split:5s} uniform-guess ceiling={ceiling:.4f}  Bayes={bayes:.4f}  Bayes(prior '
            f'over all combinations)={bayes_all:.4f}  [{time.perf_counter() - start:.1f}s]')

  print(f'== generation speed on {jax.default_backend()}, batches of 128 per second')
  for name, task in [('sraven', SRaven(seed=args.seed)),
                     ('fuzzy N=32', FuzzyLogic(num_examples=32, seed=args.seed))]:
    sample = functools.partial(task.sample, split='train')
    encoded = jax.jit(lambda k, b, sample=sample, task=task: task.encode(sample(k, b)),
                      static_argnums=1)
    print(f'{name}: {batches_per_second(sample):.0f} batches/s')
    print(f'{name}+encode: {batches_per_second(encoded):.0f} batches/s')


if __name__ == '__main__':
  cli.run_plain(main)
