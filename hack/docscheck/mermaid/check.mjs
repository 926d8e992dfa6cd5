// Parses every ```mermaid block of the Markdown files named on the command
// line with mermaid's own parser, the step whose failure a Markdown viewer
// shows as "Unable to render". Mermaid wants a DOM even to parse: jsdom
// gives it one. Prints one line per diagram; exits 1 if any fails.
import { JSDOM } from 'jsdom';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import('mermaid');
mermaid.initialize({ startOnLoad: false });
const version = createRequire(import.meta.url)('mermaid/package.json').version;
console.log(`mermaid ${version}, node ${process.version}`);

let diagrams = 0, failed = 0;
for (const file of process.argv.slice(2)) {
  const text = readFileSync(file, 'utf8');
  const block = /^```mermaid\n([\s\S]*?)^```/gm;
  for (let m; (m = block.exec(text)); ) {
    diagrams++;
    const line = text.slice(0, m.index).split('\n').length;
    try {
      const r = await mermaid.parse(m[1]);
      console.log(`ok    ${file}:${line} (${r.diagramType})`);
    } catch (e) {
      failed++;
      console.log(`FAIL  ${file}:${line}: ${String(e.message ?? e).trim()}`);
    }
  }
}
console.log(`${diagrams} diagrams, ${failed} failed`);
process.exit(failed > 0 || diagrams === 0 ? 1 : 0);
