// `vsce package` wants a LICENSE beside package.json: use the repository's.
import { copyFileSync } from 'node:fs';
copyFileSync(new URL('../../../LICENSE', import.meta.url), new URL('../LICENSE', import.meta.url));
