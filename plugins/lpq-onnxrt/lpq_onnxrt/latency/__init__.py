"""Latency-aware quantization: keep in fp32 what int8 makes slower on this machine.

int8 is not faster everywhere. Small depthwise convs, tiny MatMuls and elementwise ops
between float neighbours pay more for QuantizeLinear/DequantizeLinear than they save, and
whether a kernel wins depends on the CPU (VNNI or not), the thread count and the batch.
Rather than guess, this package *measures* on the machine at hand, in context. The search
is core's (:func:`lpq.latency.decide`, with the steps in core's words: formats are its
variants, dynamic int8 its alternative mode); :mod:`.backend` answers its questions for
ONNX Runtime and carries the numbers below (:data:`.backend.RULES`):

1. format: the full int8 plan in QDQ and in QOperator (when the user did not pick one);
   the faster one is kept;
1b. dynamic int8 for the static ops that have a constant weight and a dynamic option
   (MatMul: the Q/K/V/FFN projections of a transformer): kept when it is faster, or as
   fast and no less faithful to fp32 on the measuring batch (activation ranges computed
   per run never clip, and one DynamicQuantizeLinear serves the three projections);
2. op types, most expensive first: the plan with every op of that type in fp32 against the
   current plan; the type goes back to fp32 when the model gets faster. Where the op
   latency table (:mod:`lpq.latency.table`, filled from the per-node profiles of step 3,
   across models and runs) finds the type's ops 1.3x faster in int8 at every sample, or
   the current model's own profile predicts them 20% slower in fp32, the type stays int8
   without a build or a timing (the other direction is always timed);
3. single ops the profiler blames (their int8 node plus the Q/DQ nodes around them cost
   more than the fp32 node did): tried together, kept in fp32 when the model gets faster,
   again while no round loses (up to ``BLAME_ROUNDS``: moved Q/DQ nodes show new slow
   spots; a round that wins nothing may enable the next);
3b. each other format gets steps 2 and 3 of its own, and wins when its result beats the
   current plan (step 1 judged the formats with every op int8; the better one may lose
   once each has its slow ops back in float);
3c. fidelity, small models (at most 16 int8 ops left): ops that alone in fp32 cut the
   output error by 20% go to dynamic int8 where offered, else to fp32, together, kept
   when that costs no more than the margin;
4. never slower than fp32: if the fp32 model beats the result by the margin, every op
   stays fp32.

Every comparison times whole models, interleaved (a run of each, in turn, many times), at
one sample unless ``latency_batch_size`` says otherwise, and judges the median of the
per-round ratios, so drift on a shared machine hits both sides alike; a change is accepted
only when it wins by ``margin`` at the pessimistic bound. The decisions (ops kept in
fp32, the format) are cached on disk per model, machine, input shape, thread count and
requested plan, so a tuning run and a later ``lpq quantize`` of the same model pay once.

Modules, by job: :mod:`.aware` (whether it runs; the measuring feed, the cache, then the
search, for one model), :mod:`.backend` (core's search answered for ORT: building,
timing, blame, table, fidelity; the rules; the decision in lpq-onnxrt's words),
:mod:`.timing` (ORT sessions timed through core's sequential statistic,
:func:`lpq.latency.timing.sequential_compare`, and the comparer core's search times with),
:mod:`.blame` (per-node profiles: which ops int8 makes slower, and the op latency table
they fill), :mod:`.signature` (an op's table key), :mod:`.fidelity` (output error
against fp32) and :mod:`.cache` (decisions on disk, and decisions derived from a larger
plan's).
"""
