/** Who may import whom: the CLI and the operations library never reach into the web admin. */
import { expect, test } from 'bun:test'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join, normalize } from 'node:path'

// Each file by its own loader: a generic arrow function (`<T>(x: T) => x`) is JSX to the tsx loader.
const transpilers = { ts: new Bun.Transpiler({ loader: 'ts' }), tsx: new Bun.Transpiler({ loader: 'tsx' }) }

function resolve(from: string, specifier: string): string | undefined {
  if (!specifier.startsWith('.')) return undefined
  const base = normalize(join(dirname(from), specifier))
  return [`${base}.ts`, `${base}.tsx`, join(base, 'index.ts'), base].find((file) => /\.tsx?$/.test(file) && existsSync(file))
}

/** Every file of src reachable from `entry` through its imports (type-only imports included: they are coupling too). */
function reachable(entry: string): Set<string> {
  const seen = new Set<string>()
  const todo = [entry]
  while (todo.length) {
    const file = todo.pop()!
    if (seen.has(file) || !existsSync(file) || !/\.(ts|tsx)$/.test(file)) continue
    seen.add(file)
    const source = readFileSync(file, 'utf8').replace(/^#!.*\n/, '')
    const specifiers = [...source.matchAll(/^\s*(?:import|export)[^'"]*?from\s+['"]([^'"]+)['"]/gm)].map((match) => match[1]!)
    for (const imported of transpilers[file.endsWith('.tsx') ? 'tsx' : 'ts'].scanImports(source)) specifiers.push(imported.path)
    for (const specifier of specifiers) {
      const target = resolve(file, specifier)
      if (target) todo.push(target)
    }
  }
  return seen
}

test('the CLI imports nothing from the admin, the HTTP layer or the server', () => {
  const files = [...reachable('src/cli.ts')]
  expect(files).toContain('src/operations/index.ts')
  expect(files.filter((file) => /^src\/(admin|http|payments)\/|^src\/server\.ts$/.test(file))).toEqual([])
})

test('the operations library stands below every caller: no admin, no HTTP, no CLI', () => {
  const files = [...reachable('src/operations/index.ts'), ...reachable('src/operations/json.ts'), ...reachable('src/operations/describe.ts')]
  expect(files.filter((file) => /^src\/(admin|http|payments|metrics|cli)\/|^src\/(cli|server)\.ts$/.test(file))).toEqual([])
})
