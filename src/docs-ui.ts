/**
 * The browsable API docs at /docs: Swagger UI from the installed
 * `swagger-ui-dist` package (version pinned by package-lock.json), served by
 * us, from our origin, with a CSP that lets nothing else in. No CDN: /docs
 * works with no network, and no third party can swap code into the origin
 * that also serves /admin (a changed CDN script could have read the admin
 * page with an operator's cookie).
 *
 * Why Swagger UI: a static bundle with no runtime dependency, kept by
 * SmartBear since 2011, 1.7 MB of script (0.5 MB gzipped, which is how it is
 * sent), and it needs no inline script, no eval and no other origin (the
 * browser test checks). @scalar/api-reference installs a tree of dozens of
 * packages (Vue among them) for its one standalone file, and loads its fonts
 * from its CDN unless told not to; Redoc 3 needs React as a peer.
 *
 * Assets live under a path with the package's version, so browsers may keep
 * them a year and an upgrade is never served stale. The page's own script
 * (which points Swagger UI at the page's data-openapi, /openapi.json) is a
 * file of ours, not inline.
 */
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { Elysia } from 'elysia'
import { DOCS_PATH, OPENAPI_PATH } from './api-docs'

const DIST = dirname(Bun.resolveSync('swagger-ui-dist/package.json', import.meta.dir))
const VERSION: string = (JSON.parse(readFileSync(join(DIST, 'package.json'), 'utf8')) as { version: string }).version
const ASSETS = `${DOCS_PATH}/assets/${VERSION}`

/**
 * Only our origin: scripts and styles from /docs/assets, the document and
 * "Try it out" requests to ourselves; no inline script or style (Swagger UI
 * needs neither: the browser test opens every operation and sees no
 * violation). `img-src data:`: its icons are SVG data URLs in its CSS.
 */
export const DOCS_CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "form-action 'none'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
].join('; ')

const INIT_SCRIPT = `window.addEventListener('load', function () {
  var root = document.getElementById('swagger-ui');
  window.ui = SwaggerUIBundle({
    url: root.getAttribute('data-openapi'),
    dom_id: '#swagger-ui',
    deepLinking: true,
    layout: 'BaseLayout',
    presets: [SwaggerUIBundle.presets.apis],
    validatorUrl: null,
    tryItOutEnabled: false,
    persistAuthorization: false,
  });
});
`

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>idempotent-post: API docs</title>
<link rel="stylesheet" href="${ASSETS}/swagger-ui.css">
<link rel="icon" type="image/png" href="${ASSETS}/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui" data-openapi="${OPENAPI_PATH}"></div>
<script src="${ASSETS}/swagger-ui-bundle.js"></script>
<script src="${ASSETS}/init.js"></script>
</body>
</html>
`

interface Asset {
  readonly type: string
  readonly body: () => Uint8Array<ArrayBuffer>
}

/** Read on first use, then kept (the bundle is 1.7 MB; most processes never serve it). */
function cached(load: () => Uint8Array<ArrayBuffer>): () => Uint8Array<ArrayBuffer> {
  let bytes: Uint8Array<ArrayBuffer> | undefined
  return () => (bytes ??= load())
}

const fromDist = (file: string) => cached(() => new Uint8Array(readFileSync(join(DIST, file))))
const ASSET_FILES: Readonly<Record<string, Asset>> = {
  'swagger-ui-bundle.js': { type: 'text/javascript; charset=utf-8', body: fromDist('swagger-ui-bundle.js') },
  'swagger-ui.css': { type: 'text/css; charset=utf-8', body: fromDist('swagger-ui.css') },
  'favicon-32x32.png': { type: 'image/png', body: fromDist('favicon-32x32.png') },
  'init.js': { type: 'text/javascript; charset=utf-8', body: cached(() => new TextEncoder().encode(INIT_SCRIPT)) },
}
const gzipped = new Map<string, Uint8Array<ArrayBuffer>>()

const HEADERS = { 'content-security-policy': DOCS_CONTENT_SECURITY_POLICY, 'x-frame-options': 'DENY', 'referrer-policy': 'same-origin' }

function assetResponse(name: string, request: Request): Response {
  const asset = ASSET_FILES[name]
  if (!asset) return new Response('Not found', { status: 404, headers: { 'content-type': 'text/plain; charset=utf-8' } })
  const headers: Record<string, string> = { ...HEADERS, 'content-type': asset.type, 'cache-control': 'public, max-age=31536000, immutable', vary: 'accept-encoding' }
  if (!/\bgzip\b/.test(request.headers.get('accept-encoding') ?? '') || asset.type === 'image/png') return new Response(asset.body(), { headers })
  let body = gzipped.get(name)
  if (!body) gzipped.set(name, (body = Bun.gzipSync(asset.body())))
  return new Response(body, { headers: { ...headers, 'content-encoding': 'gzip' } })
}

/** GET /docs and its assets. */
export function docsUi() {
  return new Elysia({ name: 'docs-ui' })
    .get(DOCS_PATH, () => new Response(PAGE, { headers: { ...HEADERS, 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-cache' } }), { detail: { hide: true } })
    .get(`${ASSETS}/:file`, ({ params, request }) => assetResponse(params.file, request), { detail: { hide: true } })
}
