#!/bin/bash
# alternating arms in one sitting: old = main fa0259d (/work/wt/replan-base), new = replan 3d2fbcc (/work/wt/replan-fp)
out=/tmp/replan/sit
for pol in carbyne sjf; do
  for step in old:100 new:100 old:300 new:300 new:1000; do
    arm=${step%%:*}; d=${step##*:}
    if [ $arm = old ]; then tree=/work/wt/replan-base; else tree=/work/wt/replan-fp; fi
    (cd $tree && PYTHONPATH=$tree python benchmarks/bench_replan.py --chain-depth $d --nodes 1000 --lms 10 --policies $pol --out $out/${pol}_${arm}_${d}.json) 2>&1 | grep depth | sed "s/^/$arm /"
  done
done
echo DONE
