#!/usr/bin/env node
// Generates src/gen/ from proto/ (and google.rpc.ErrorInfo) with buf and protoc-gen-es, both
// pinned in package-lock.json: `node scripts/generate.mjs`.
//
// With --check it generates into a temporary directory instead and exits 1, naming every file
// that differs, when src/gen/ is stale or was edited by hand; the test run calls it.

import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const bin = join(root, "node_modules", ".bin");
const check = process.argv.includes("--check");

/** Runs buf generate with its output under `base`; exits on failure. */
function generate(base) {
  const run = spawnSync(join(bin, "buf"), ["generate", "--output", base], {
    cwd: root,
    stdio: "inherit",
    env: { ...process.env, PATH: `${bin}:${process.env.PATH ?? ""}` },
  });
  if (run.status !== 0) {
    console.error(`buf generate failed (${run.error ?? `status ${run.status}`}): did npm ci run in ${root}?`);
    process.exit(1);
  }
}

/** Every file under `dir` by its path relative to `dir`, with its contents. */
function files(dir) {
  const found = new Map();
  const walk = (at) => {
    for (const entry of readdirSync(at, { withFileTypes: true })) {
      const path = join(at, entry.name);
      if (entry.isDirectory()) walk(path);
      else found.set(relative(dir, path), readFileSync(path, "utf8"));
    }
  };
  try {
    walk(dir);
  } catch (error) {
    if (error.code !== "ENOENT") throw error;
  }
  return found;
}

if (!check) {
  generate(root);
  process.exit(0);
}
const fresh = mkdtempSync(join(tmpdir(), "idempost-ts-gen-"));
try {
  generate(fresh);
  const want = files(join(fresh, "src", "gen"));
  const have = files(join(root, "src", "gen"));
  const stale = [...new Set([...want.keys(), ...have.keys()])]
    .filter((path) => want.get(path) !== have.get(path))
    .sort();
  if (stale.length > 0) {
    console.error(
      `clients/typescript/src/gen is stale or was edited by hand: ${stale.join(", ")}.\n` +
        "Regenerate it with `npm run generate` in clients/typescript and commit the result.",
    );
    process.exit(1);
  }
  console.error(`clients/typescript/src/gen matches proto/ (${want.size} files)`);
} finally {
  rmSync(fresh, { recursive: true, force: true });
}
