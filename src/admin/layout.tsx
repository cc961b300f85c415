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
header { display: flex; align-items: center; gap: 16px; padding: 10px 20px; background: #24292f; color: #fff; }
header h1 { font-size: 16px; margin: 0; font-weight: 600; }
header nav { margin-left: auto; display: flex; gap: 14px; align-items: center; }
header a, header button { color: #fff; }
main { padding: 16px 20px; max-width: 1280px; }
h2 { font-size: 15px; margin: 22px 0 8px; }
a { color: #0969da; }
table { width: 100%; border-collapse: collapse; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; font-size: 12px; text-transform: uppercase; color: var(--muted); }
td.key, td.mono, .mono { font-family: ui-monospace, monospace; font-size: 13px; word-break: break-all; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.stale td { background: #fff8f7; }
.tag { display: inline-block; padding: 0 6px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.tag.stale { background: #ffebe9; color: var(--bad); }
.tag.fresh { background: #ddf4ff; color: #0550ae; }
.counts { display: flex; gap: 12px; flex-wrap: wrap; margin: 4px 0 12px; }
.count { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 130px; }
.count b { display: block; font-size: 20px; font-variant-numeric: tabular-nums; }
.count.alert b { color: var(--bad); }
.count span { color: var(--muted); font-size: 12px; }
form.inline { display: inline; margin: 0; }
form.filters { display: flex; gap: 10px; align-items: end; flex-wrap: wrap; background: #fff; border: 1px solid var(--line); padding: 10px; margin-bottom: 10px; }
label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: 2px; }
label.check { flex-direction: row; align-items: center; gap: 6px; font-size: 14px; color: inherit; }
input[type=text], input[type=password] { font: inherit; padding: 4px 6px; border: 1px solid var(--line); border-radius: 4px; min-width: 180px; }
button, .button { font: inherit; padding: 4px 10px; border-radius: 4px; border: 1px solid var(--line); background: #f6f8fa; cursor: pointer; color: #1f2328; text-decoration: none; display: inline-block; }
button.danger { background: var(--bad); border-color: var(--bad); color: #fff; }
header button { background: transparent; border-color: #57606a; }
.notice { border: 1px solid var(--line); border-left-width: 4px; background: #fff; padding: 10px 12px; margin-bottom: 12px; }
.notice.ok { border-left-color: var(--ok); }
.notice.warn { border-left-color: var(--warn); }
.notice.bad { border-left-color: var(--bad); }
.muted { color: var(--muted); }
.pager { margin: 10px 0; display: flex; gap: 12px; }
.signin { max-width: 360px; margin: 80px auto; background: #fff; border: 1px solid var(--line); padding: 20px; display: flex; flex-direction: column; gap: 12px; }
.signin input { min-width: 0; width: 100%; }
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

export interface LayoutProps {
  readonly title: string
  /** Signed-in pages show the operator's name and a sign-out button. */
  readonly operator?: { name: string; csrf: string } | undefined
}

export function Layout({ title, operator, children }: PropsWithChildren<LayoutProps>): JSX.Element {
  return (
    <>
      {'<!doctype html>'}
      <html lang="en">
        <head>
          <meta charset="utf-8" />
          <meta name="viewport" content="width=device-width, initial-scale=1" />
          <meta name="referrer" content="same-origin" />
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
                <span safe>{operator.name}</span>
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
