// Bundles the console (src/main.ts and the stubs it imports from clients/typescript/src/gen) into
// dist/console.js, which idempostctl embeds with static/. `node build.mjs --check` builds in memory and fails
// naming every file of dist/ that differs, so a committed bundle never lags behind its sources.
import * as esbuild from "esbuild";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, "dist");
const check = process.argv.includes("--check");

// The stubs live under clients/typescript, whose own node_modules may hold another copy of the
// runtime: resolve every package from this directory so the bundle holds exactly one.
const ownPackages = {
  name: "own-packages",
  setup(build) {
    build.onResolve({ filter: /^@(bufbuild|connectrpc)\// }, async (args) => {
      if (args.pluginData === "own") return undefined;
      return build.resolve(args.path, { kind: args.kind, resolveDir: here, pluginData: "own" });
    });
  },
};

const result = await esbuild.build({
  entryPoints: [join(here, "src/main.ts")],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  legalComments: "eof",
  charset: "utf8",
  write: false,
  outfile: join(dist, "console.js"),
  plugins: [ownPackages],
  logLevel: "warning",
});

// The page and its stylesheet need no build: idempostctl embeds them from static/ as they are.
const files = new Map(result.outputFiles.map((f) => [f.path, Buffer.from(f.contents)]));

if (check) {
  const stale = [...files].filter(([path, contents]) => {
    try {
      return !readFileSync(path).equals(contents);
    } catch {
      return true;
    }
  });
  if (stale.length > 0) {
    for (const [path] of stale) console.error(`stale: ${path}`);
    console.error("the console's bundle is stale: run `npm run build` in tools/idempostctl/console and commit dist/");
    process.exit(1);
  }
  console.error(`the console's bundle is up to date (${files.size} files)`);
} else {
  mkdirSync(dist, { recursive: true });
  for (const [path, contents] of files) writeFileSync(path, contents);
  console.error(`wrote ${files.size} files to ${dist}`);
}
