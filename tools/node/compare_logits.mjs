// Compares two float32 logit files [n][V]: max |diff|, argmax agreement, first differing
// position. Usage: node compare_logits.mjs A.bin B.bin V [TOL]; exit 1 if max diff > TOL
// or any argmax differs.
import fs from "node:fs";
const [a, b, vs, tols] = process.argv.slice(2);
const V = Number(vs), tol = tols === undefined ? 1e-4 : Number(tols);
const A = new Float32Array(fs.readFileSync(a).buffer.slice(0));
const B = new Float32Array(fs.readFileSync(b).buffer.slice(0));
if (A.length !== B.length || A.length % V) {
  console.error(`size mismatch: ${A.length} vs ${B.length} floats (V=${V})`);
  process.exit(1);
}
const n = A.length / V;
let maxd = 0, maxAt = -1, firstBad = -1, argmaxBad = 0, sum2 = 0;
for (let i = 0; i < n; i++) {
  let am = 0, bm = 0, rowMax = 0;
  for (let j = 0; j < V; j++) {
    const x = A[i * V + j], y = B[i * V + j];
    const d = Math.abs(x - y);
    if (!(d <= rowMax)) rowMax = d;
    if (x > A[i * V + am]) am = j;
    if (y > B[i * V + bm]) bm = j;
    sum2 += x * x;
  }
  if (rowMax > maxd || Number.isNaN(rowMax)) { maxd = rowMax; maxAt = i; }
  if ((rowMax > tol || Number.isNaN(rowMax)) && firstBad < 0) firstBad = i;
  if (am !== bm) argmaxBad++;
}
const std = Math.sqrt(sum2 / A.length);
console.log(JSON.stringify({ positions: n, vocab: V, max_abs_diff: maxd, at: maxAt, first_over_tol: firstBad, argmax_mismatch: argmaxBad, logit_rms: std }));
process.exit(maxd <= tol && argmaxBad === 0 ? 0 : 1);
