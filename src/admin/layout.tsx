import { visibleText } from '../characters'
import { escapeHtml, type PropsWithChildren } from '@kitajs/html'

/**
 * The page's only style, inline. The Content-Security-Policy allows exactly
 * this text (by hash) and no script at all, so even an escaping mistake
 * elsewhere could not run anything.
 */
export const STYLE = `
:root { color-scheme: light; --line: #d0d7de; --muted: #57606a; --bad: #b42318; --warn: #9a6700; --ok: #1a7f37; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
header { display: flex; align-items: center; flex-wrap: wrap; gap: 8px 16px; padding: 10px 20px; background: #24292f; color: #fff; }
header h1 { font-size: 16px; margin: 0; font-weight: 600; }
header nav { margin-left: auto; display: flex; flex-wrap: wrap; gap: 8px 14px; align-items: center; }
header a, header button { color: #fff; }
main { padding: 16px 20px; max-width: 1280px; }
h2 { font-size: 15px; margin: 22px 0 8px; overflow-wrap: anywhere; }
a { color: #0969da; }
table { width: 100%; border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; font-size: 12px; text-transform: uppercase; color: var(--muted); }
.mono, td.key { font-family: ui-monospace, monospace; font-size: 13px; overflow-wrap: anywhere; }
td.key { min-width: 14ch; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.actions { white-space: nowrap; }
tr.stale td { background: #fff8f7; }
.tag { display: inline-block; padding: 0 6px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.tag.stale, .tag.bad { background: #ffebe9; color: var(--bad); }
.tag.fresh { background: #ddf4ff; color: #0550ae; }
.tag.ok { background: #dafbe1; color: var(--ok); }
.counts { display: flex; gap: 12px; flex-wrap: wrap; margin: 4px 0 12px; }
.count { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 130px; }
.count b { display: block; font-size: 20px; font-variant-numeric: tabular-nums; }
.count.alert b { color: var(--bad); }
.count span { color: var(--muted); font-size: 12px; }
form.inline { display: inline; margin: 0; }
form.filters { display: flex; gap: 10px; align-items: end; flex-wrap: wrap; background: #fff; border: 1px solid var(--line); padding: 10px; margin-bottom: 10px; }
label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: 2px; }
label.check { flex-direction: row; align-items: center; gap: 6px; font-size: 14px; color: inherit; }
input[type=text], input[type=password], select { font: inherit; padding: 4px 6px; border: 1px solid var(--line); border-radius: 4px; min-width: 160px; max-width: 100%; }
button, .button { font: inherit; padding: 4px 10px; border-radius: 4px; border: 1px solid var(--line); background: #f6f8fa; cursor: pointer; color: #1f2328; text-decoration: none; display: inline-block; }
button.danger, .button.danger { background: var(--bad); border-color: var(--bad); color: #fff; }
header button { background: transparent; border-color: #57606a; }
.bar { display: flex; flex-wrap: wrap; gap: 8px 12px; align-items: center; margin: 8px 0; }
.notice { border: 1px solid var(--line); border-left-width: 4px; background: #fff; padding: 10px 12px; margin-bottom: 12px; overflow-wrap: anywhere; }
.notice.ok { border-left-color: var(--ok); }
.notice.warn { border-left-color: var(--warn); }
.notice.bad { border-left-color: var(--bad); }
.muted { color: var(--muted); }
.pager { margin: 10px 0; display: flex; gap: 12px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; background: #fff; border: 1px solid var(--line); padding: 10px 12px; margin: 0 0 12px; }
dl.facts dt { color: var(--muted); font-size: 12px; padding-top: 2px; }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
article.runbook { background: #fff; border: 1px solid var(--line); padding: 4px 16px 12px; overflow-wrap: anywhere; }
article.runbook code { font-family: ui-monospace, monospace; font-size: 13px; background: #f6f8fa; padding: 0 3px; }
pre { background: #fff; border: 1px solid var(--line); padding: 10px; white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; }
.signin { max-width: 360px; margin: 80px auto; background: #fff; border: 1px solid var(--line); padding: 20px; display: flex; flex-direction: column; gap: 12px; }
.signin input { min-width: 0; width: 100%; }
@media (max-width: 720px) {
  main { padding: 12px 10px; }
  header { padding: 8px 10px; }
  .counts { display: grid; grid-template-columns: 1fr 1fr; gap: 6px; }
  .count { min-width: 0; padding: 6px 8px; }
  .count b { font-size: 17px; }
  table.cards, table.cards tbody, table.cards tr, table.cards td { display: block; width: 100%; }
  table.cards { border: 0; background: transparent; }
  table.cards thead { display: none; }
  table.cards tr { background: #fff; border: 1px solid var(--line); border-radius: 6px; margin-bottom: 8px; padding: 4px 0; }
  table.cards td { display: flex; gap: 10px; border: 0; padding: 3px 10px; text-align: left; white-space: normal; min-width: 0; }
  table.cards td::before { content: attr(data-label); flex: 0 0 72px; color: var(--muted); font-size: 12px; padding-top: 1px; }
  table.cards td.actions { padding-top: 6px; }
  table.cards td.actions::before { content: none; }
  dl.facts { grid-template-columns: 1fr; gap: 0 0; }
  dl.facts dd { margin-bottom: 6px; }
  input[type=text], select { min-width: 0; width: 100%; }
  form.filters label { flex: 1 1 100%; }
}
`

const STYLE_HASH = new Bun.CryptoHasher('sha256').update(STYLE).digest('base64')

/** No script, no images, no frames, forms post only to us. */
export const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  `style-src 'sha256-${STYLE_HASH}'`,
  "form-action 'self'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
].join('; ')

export interface Operator {
  readonly name: string
  readonly csrf: string
}

export interface LayoutProps {
  readonly title: string
  /** Signed-in pages show the operator's name and a sign-out button. */
  readonly operator?: Operator | undefined
  /**
   * Reload this URL every `seconds` (a <meta http-equiv="refresh">, no script:
   * the CSP allows none). Only the list sets it, with its own filters and
   * page, so a refresh never loses the operator's place; detail and
   * confirmation pages never refresh under a reader.
   */
  readonly refresh?: { readonly seconds: number; readonly url: string } | undefined
}

export function Layout({ title, operator, refresh, children }: PropsWithChildren<LayoutProps>): JSX.Element {
  return (
    <>
      {'<!doctype html>'}
      <html lang="en">
        <head>
          <meta charset="utf-8" />
          <meta name="viewport" content="width=device-width, initial-scale=1" />
          <meta name="referrer" content="same-origin" />
          {refresh ? <meta http-equiv="refresh" content={escapeHtml(`${refresh.seconds}; url=${refresh.url}`)} /> : ''}
          <title safe>{title}</title>
          <style>{STYLE}</style>
        </head>
        <body>
          <header>
            <h1>Idempotency keys · admin</h1>
            {operator ? (
              <nav>
                <a href="/admin">Keys</a>
                <a href="/admin/audit">Audit trail</a>
                <a href="/admin/sessions">Sessions</a>
                <a href="/admin/released?reason=deadline">Released after deadline</a>
                <a href="/admin/runbooks">Runbooks</a>
                <span safe>{visibleText(operator.name)}</span>
                <form class="inline" method="post" action="/admin/logout">
                  <input type="hidden" name="csrf" value={escapeHtml(operator.csrf)} />
                  <button type="submit">Sign out</button>
                </form>
              </nav>
            ) : ''}
          </header>
          <main>{children}</main>
        </body>
      </html>
    </>
  )
}
