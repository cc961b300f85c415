/** Small helpers for talking to the service like a client does. */

export interface PaymentBody {
  amount: number
  currency: string
  customer: string
  description?: string
}

export const payment = (overrides: Partial<PaymentBody> = {}): PaymentBody => ({
  amount: 1250,
  currency: 'EUR',
  customer: 'cus_1',
  ...overrides,
})

export interface PostOptions {
  apiKey?: string | null
  key?: string | null
  contentType?: string
  headers?: Record<string, string>
  signal?: AbortSignal
}

export function postPayment(baseUrl: string, body: unknown, options: PostOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { 'content-type': options.contentType ?? 'application/json', ...options.headers }
  const apiKey = options.apiKey === undefined ? 'acme-key' : options.apiKey
  if (apiKey !== null) headers.authorization = `Bearer ${apiKey}`
  if (options.key !== null) headers['idempotency-key'] = options.key ?? crypto.randomUUID()
  return fetch(`${baseUrl}/api/payments`, {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
    ...(options.signal ? { signal: options.signal } : {}),
  })
}

export async function json(response: Response): Promise<any> {
  return JSON.parse(await response.text())
}
