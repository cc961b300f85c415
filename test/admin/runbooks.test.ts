/** The runbook renderer (src/admin/runbooks.ts): the guide's sections, escaped, links kept on this origin. */
import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { ALERTS } from '../../dashboards/alert-definitions'
import { loadRunbooks, OPERATORS_GUIDE } from '../../src/admin/runbooks'

const GUIDE = `# Guide

## Alert runbooks

### AlertOne

Text <script>alert(1)</script> & **bold** \`<code>\`, \`/admin/released?reason=deadline\`, \`/admin?tenant=<tenant>\`, see [two](#alerttwo), [the docs](observability.md#alerts),
[elsewhere](https://evil.example/x), [the list](/admin?stale=1), [sneaky](//evil.example/x) and ![a picture](https://evil.example/p.png).

<div onclick="steal()">raw block</div>

### AlertTwo

Two.

## After the runbooks

### NotARunbook
`

test('each alert section of the guide is a runbook; raw HTML is shown as text; links stay on this origin; images are dropped', () => {
  const runbooks = loadRunbooks(GUIDE)
  expect([...runbooks.keys()]).toEqual(['AlertOne', 'AlertTwo'])
  const html = runbooks.get('AlertOne')!.html
  expect(html).not.toContain('<script')
  expect(html).not.toContain('<div')
  expect(html).not.toContain('<img')
  expect(html).toContain('&lt;script&gt;alert(1)&lt;/script&gt;')
  expect(html).toContain('&lt;div onclick=&quot;steal()&quot;&gt;raw block&lt;/div&gt;')
  expect(html).toContain('<code>&lt;code&gt;</code>')
  expect(html).toContain('<a href="/admin/runbooks/AlertTwo">two</a>')
  expect(html).toContain('<a href="/admin?stale=1">the list</a>')
  const hrefs = [...html.matchAll(/href="([^"]*)"/g)].map((match) => match[1])
  expect(hrefs).toEqual(['/admin/released?reason=deadline', '/admin/runbooks/AlertTwo', '/admin?stale=1'])
  expect(html).toContain('<code>/admin?tenant=&lt;tenant&gt;</code>') // a placeholder: text, not a link
  expect(html).toContain('<span class="ref">elsewhere</span>')
})

test('the shipped guide has a runbook for every alert', () => {
  const runbooks = loadRunbooks(readFileSync(OPERATORS_GUIDE, 'utf8'))
  for (const alert of ALERTS) expect({ alert: alert.name, has: runbooks.has(alert.name) }).toEqual({ alert: alert.name, has: true })
})
