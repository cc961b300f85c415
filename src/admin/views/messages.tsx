/** Sign-in and plain messages. */
import { escapeHtml } from '@kitajs/html'
import { Layout, type Operator } from '../layout'

/** `next`: the admin page asked for before signing in (an alert's filtered link), reached right after. */
export function SignInPage({ error, next }: { error?: string | undefined; next?: string | undefined }): JSX.Element {
  return (
    <Layout title="Sign in · admin">
      <form class="signin" method="post" action="/admin/login">
        <h2>Sign in</h2>
        {error ? <div class="notice bad" safe>{error}</div> : ''}
        <label>
          Your operator token (ADMIN_TOKENS or ADMIN_TOKEN)
          <input type="password" name="token" autocomplete="current-password" required autofocus />
        </label>
        <label>
          A note for the audit trail (optional; your name comes from your token)
          <input type="text" name="note" maxlength="40" pattern="[A-Za-z0-9 ._@\-]{1,40}" placeholder="e.g. incident 4312" />
        </label>
        {next ? <input type="hidden" name="next" value={escapeHtml(next)} /> : ''}
        <button type="submit">Sign in</button>
      </form>
    </Layout>
  )
}

export function MessagePage({ title, message, operator }: { title: string; message: string; operator?: Operator | undefined }): JSX.Element {
  return (
    <Layout title={title} operator={operator}>
      <h2 safe>{title}</h2>
      <p safe>{message}</p>
      <p><a href="/admin">Back to the keys</a></p>
    </Layout>
  )
}
