import { chromium, type Browser } from 'playwright-core'

/** Headless, and quiet on the network: nothing but the pages a test opens (no updates, sync or QUIC probes). */
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']

/** Debian's Chromium (`.ci/run` installs it), or the one CHROMIUM_PATH names. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium', args: CHROMIUM_ARGS })
}
