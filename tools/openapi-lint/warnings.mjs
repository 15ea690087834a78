// Holds docs/api-lint.md's table of the warnings Spectral leaves to what
// Spectral reports: every rule that warns is in the table with its count,
// and every rule in the table still warns. Spectral's JSON comes on stdin
// (`spectral lint -f json`); the table is read from the path given.
import { readFileSync } from "node:fs";

const [doc] = process.argv.slice(2);
const results = JSON.parse(readFileSync(0, "utf8"));
const reported = new Map();
for (const r of results) {
  if (r.severity === 0) continue; // errors: the lint itself fails on them
  reported.set(r.code, (reported.get(r.code) ?? 0) + 1);
}
const text = readFileSync(doc, "utf8");
const listed = new Map();
for (const [, rule, count] of text.matchAll(/^\| `([^`]+)`[^|]*\| (\d+) \|/gm)) {
  listed.set(rule, Number(count));
}
const total = [...reported.values()].reduce((a, b) => a + b, 0);
const problems = [];
for (const [rule, n] of reported) {
  if (!listed.has(rule)) problems.push(`${rule}: ${n} warnings, not in the table (say why it stays)`);
  else if (listed.get(rule) !== n) problems.push(`${rule}: ${n} warnings, the table says ${listed.get(rule)}`);
}
for (const rule of listed.keys()) {
  if (!reported.has(rule)) problems.push(`${rule}: in the table, but Spectral no longer reports it`);
}
const said = text.match(/\((\d+) today\)/);
if (!said || Number(said[1]) !== total) problems.push(`${total} warnings in all, the text says ${said ? said[1] : "nothing"} ("(N today)")`);
if (problems.length) {
  console.error(`${doc} does not match Spectral's warnings:\n  ${problems.join("\n  ")}`);
  process.exit(1);
}
console.log(`Spectral's ${total} warnings: each rule listed in ${doc} with its count`);
