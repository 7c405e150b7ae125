"""Study runner: named arms of ``fairseq-train`` on one data-bin, one GPU (or the CPU), one budget.

An *arm* is a name plus ``fairseq-train`` arguments on top of a common base (a preset's, or
``--base-args``). :func:`~.runner.run_study`

1. validates every arm's arguments with fairseq's own parser before anything runs;
2. groups the GradInit arms by what determines their scales
   (:func:`~fairseq_gradinit.fairseq_plugin.phase.provenance.fingerprint_from_args`: model arguments,
   criterion, seed, data, world size, GradInit settings) and computes each group's scales once, in a
   *GradInit phase* (:func:`~.plan.gradinit_phase_main`: the task, model and criterion built exactly as
   ``fairseq-train`` builds them, no training), into a cache folder that later studies reuse while
   the fingerprint matches; every arm of the group then starts from those scales through
   ``--gradinit-init-file`` (training from re-applied scales with the same seed reproduces a run
   that computed them);
3. runs the phases and the arms as subprocesses, up to ``parallel`` at once (several small models
   share one GPU; on the CPU use 1), each arm with ``--stop-time-hours`` set from what is left of the
   wall-time budget, and kills whatever still runs when the budget is spent;
4. writes ``curves.csv`` (per arm and logged update: eval-mode validation loss, training loss, fp16
   loss scale, lr, gradient norm, from fairseq's log), ``curves.png``, ``curves.md`` and
   ``study.json``, and BLEU (:mod:`fairseq_gradinit.tools.evaluate_bleu`: beam 5, detokenized, sacreBLEU) of every
   arm at the largest checkpoint update that all arms reached, in the same run, so checkpoints never
   have to leave the machine.

The command line is ``python -m lab.study`` (:func:`~.cli.main`); presets are in :mod:`.presets` (data files
``preset_data/*.toml``, read by :mod:`.preset_schema`). Modules:
:mod:`.arms` (arm specs, pure Python), :mod:`.plan` (configuration, plan, GradInit phase; fairseq
imported there only, lazily), :mod:`.scheduler`, :mod:`.results`, :mod:`.runner`, :mod:`.cli`,
:mod:`.tables` (tables of a finished study, pure Python), :mod:`.estimate` (durations from measured GPU
throughput, pure Python) and :mod:`.archive` (one ``.tar.gz`` of everything a study exports).
"""
