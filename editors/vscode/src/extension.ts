// laya for VS Code: starts `laya lsp`, shows its inline completions as ghost text, and keeps a
// status bar item with the model's state (starting, loading, ready, error, off).

import * as vscode from 'vscode';
import {
  ClientCapabilities,
  Disposable,
  ErrorCodes,
  Executable,
  FeatureState,
  LanguageClient,
  LanguageClientOptions,
  ResponseError,
  ServerCapabilities,
  StaticFeature,
  State,
  WorkDoneProgress,
  WorkDoneProgressBegin,
  WorkDoneProgressCreateParams,
  WorkDoneProgressCreateRequest,
  WorkDoneProgressEnd,
  WorkDoneProgressReport,
} from 'vscode-languageclient/node';

/** The progress token laya uses while its model loads. */
const MODEL_TOKEN = 'laya/model';

type ModelState = 'starting' | 'loading' | 'ready' | 'error' | 'off';

/** What was last shown as ghost text, for `laya.explainLastSuggestion`. */
interface LastSuggestion {
  uri: string;
  languageId: string;
  position: vscode.Position;
  text: string;
  range?: vscode.Range;
  latencyMs: number;
  at: Date;
}

let client: LanguageClient | undefined;
let status: vscode.StatusBarItem;
let output: vscode.LogOutputChannel;
let modelState: ModelState = 'starting';
let stateDetail = '';
let lastSuggestion: LastSuggestion | undefined;

function config(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration('laya');
}

function enabled(): boolean {
  return config().get<boolean>('enable', true);
}

/** The `completion` settings laya reads from `initializationOptions`. */
function serverSettings(): object {
  const c = config();
  return {
    completion: {
      // Unset (null): laya's wait follows the typing pace.
      debounceMs: c.get<number | null>('completion.debounceMs', null),
      languages: c.get<string[]>('completion.languages', []),
      maxTokensLine: c.get<number>('completion.maxTokensLine', 48),
      maxTokensBlock: c.get<number>('completion.maxTokensBlock', 128),
      candidates: c.get<number>('completion.candidates', 1),
    },
  };
}

/** `laya lsp` and its flags from the settings. */
function serverCommand(): Executable {
  const c = config();
  const args = ['lsp'];
  const model = c.get<string>('model', '').trim();
  if (model) args.push('--model', model);
  const precision = c.get<string>('precision', '').trim();
  if (precision) args.push('--precision', precision);
  const remoteUrl = c.get<string>('remote.url', '').trim();
  if (remoteUrl) args.push('--remote-url', remoteUrl);
  const remoteModel = c.get<string>('remote.model', '').trim();
  if (remoteModel) args.push('--remote-model', remoteModel);
  args.push(...c.get<string[]>('extraArgs', []));
  return { command: c.get<string>('path', '').trim() || 'laya', args };
}

function setState(state: ModelState, detail = ''): void {
  modelState = state;
  stateDetail = detail;
  renderStatus();
}

function renderStatus(): void {
  const shown: ModelState = enabled() ? modelState : 'off';
  const icon: Record<ModelState, string> = {
    starting: '$(sync~spin)',
    loading: '$(sync~spin)',
    ready: '$(sparkle)',
    error: '$(error)',
    off: '$(circle-slash)',
  };
  const words: Record<ModelState, string> = {
    starting: 'starting',
    loading: 'loading model',
    ready: 'ready',
    error: 'error',
    off: 'off',
  };
  status.text = `${icon[shown]} laya`;
  status.tooltip = `laya: ${words[shown]}${stateDetail ? ` (${stateDetail})` : ''}\nClick for laya's commands.`;
  status.backgroundColor =
    shown === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
  // For tests and scripts: the state as a plain word.
  status.name = `laya ${shown}`;
  status.accessibilityInformation = { label: `laya ${words[shown]}` };
  status.show();
}

/**
 * Takes over `window/workDoneProgress/create` (registered after the client's own progress
 * feature, so this handler wins) to follow the model's loading into the status bar, and shows
 * every progress in the window as the client would.
 */
class ModelProgressFeature implements StaticFeature {
  private parts: Disposable[] = [];

  constructor(private readonly lc: LanguageClient) {}

  fillClientCapabilities(capabilities: ClientCapabilities): void {
    capabilities.window = capabilities.window ?? {};
    capabilities.window.workDoneProgress = true;
  }

  getState(): FeatureState {
    return { kind: 'static' };
  }

  initialize(_capabilities: ServerCapabilities): void {
    this.parts.push(
      this.lc.onRequest(WorkDoneProgressCreateRequest.type, (params: WorkDoneProgressCreateParams) =>
        this.follow(params.token),
      ),
    );
  }

  private follow(token: string | number): void {
    let finish: (() => void) | undefined;
    let report: ((message?: string, pct?: number) => void) | undefined;
    const sub = this.lc.onProgress(
      WorkDoneProgress.type,
      token,
      (value: WorkDoneProgressBegin | WorkDoneProgressReport | WorkDoneProgressEnd) => {
        if (value.kind === 'begin') {
          if (token === MODEL_TOKEN) setState('loading', value.message ?? '');
          void vscode.window.withProgress(
            { location: vscode.ProgressLocation.Window, title: value.title },
            (progress) =>
              new Promise<void>((resolve) => {
                finish = resolve;
                report = (message, increment) => progress.report({ message, increment });
              }),
          );
        } else if (value.kind === 'report') {
          report?.(value.message, value.percentage);
        } else {
          const message = value.message ?? '';
          if (token === MODEL_TOKEN) {
            if (/^fail|error/i.test(message)) {
              setState('error', message);
              output.error(`laya: ${message}`);
            } else {
              setState('ready', message);
            }
          }
          finish?.();
          sub.dispose();
        }
      },
    );
    this.parts.push(sub);
  }

  clear(): void {
    this.parts.forEach((d) => d.dispose());
    this.parts = [];
  }
}

async function startClient(context: vscode.ExtensionContext): Promise<void> {
  const cmd = serverCommand();
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: 'file' }, { scheme: 'untitled' }],
    initializationOptions: serverSettings(),
    synchronize: { configurationSection: 'laya' },
    outputChannel: output,
    middleware: {
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        if (!enabled()) return undefined;
        const started = Date.now();
        const result = await next(document, position, context, token);
        const items = Array.isArray(result) ? result : result?.items ?? [];
        const first = items[0];
        if (first) {
          const text =
            typeof first.insertText === 'string' ? first.insertText : first.insertText.value;
          lastSuggestion = {
            uri: document.uri.toString(),
            languageId: document.languageId,
            position,
            text,
            range: first.range,
            latencyMs: Date.now() - started,
            at: new Date(),
          };
        }
        return result;
      },
      // Ghost text is VS Code's view of laya; the same suggestions as completion items
      // would only repeat it in the suggest widget.
      provideCompletionItem: () => undefined,
    },
  };
  const lc = new LanguageClient('laya', 'laya', { run: cmd, debug: cmd }, clientOptions);
  lc.registerFeature(new ModelProgressFeature(lc));
  lc.onDidChangeState((e) => {
    if (e.newState === State.Stopped && modelState !== 'error') {
      setState('error', 'the server stopped');
    }
  });
  client = lc;
  setState('starting', `${cmd.command} ${cmd.args?.join(' ')}`);
  try {
    await lc.start();
    // A remote tier has nothing to load; a local model reports its loading through progress.
    if (modelState === 'starting') {
      const remote = config().get<string>('remote.url', '').trim();
      if (remote) setState('ready', `remote tier ${remote}`);
      else setState('loading', 'waiting for the model');
    }
  } catch (e) {
    setState('error', `could not start ${cmd.command}: ${e instanceof Error ? e.message : e}`);
    output.error(`laya: could not start ${cmd.command} ${cmd.args?.join(' ')}: ${e}`);
  }
  context.subscriptions.push({ dispose: () => void lc.stop() });
}

async function restart(context: vscode.ExtensionContext): Promise<void> {
  const old = client;
  client = undefined;
  if (old) {
    try {
      await old.stop();
    } catch {
      // already stopped
    }
  }
  await startClient(context);
}

async function toggle(): Promise<void> {
  await config().update('enable', !enabled(), vscode.ConfigurationTarget.Global);
  renderStatus();
  void vscode.window.setStatusBarMessage(`laya: inline suggestions ${enabled() ? 'on' : 'off'}`, 3000);
}

/** Markdown about the last suggestion: laya's own explanation when the server has one. */
async function explainLastSuggestion(): Promise<void> {
  const last = lastSuggestion;
  if (!last) {
    void vscode.window.showInformationMessage('laya: no suggestion has been shown yet.');
    return;
  }
  let fromServer: unknown;
  if (client?.isRunning()) {
    try {
      fromServer = await client.sendRequest('laya/explain', {
        textDocument: { uri: last.uri },
        position: { line: last.position.line, character: last.position.character },
        text: last.text,
      });
    } catch (e) {
      if (!(e instanceof ResponseError && e.code === ErrorCodes.MethodNotFound)) {
        output.warn(`laya/explain failed: ${e}`);
      }
    }
  }
  const fence = '`'.repeat(Math.max(3, ...(last.text.match(/`+/g) ?? []).map((m) => m.length + 1)));
  const lines = [
    '# laya: last suggestion',
    '',
    `- file: ${last.uri}`,
    `- position: line ${last.position.line + 1}, column ${last.position.character + 1}`,
    `- language: ${last.languageId}`,
    `- shown: ${last.at.toLocaleTimeString()}, ${last.latencyMs} ms after the request`,
    `- model: ${modelState}${stateDetail ? ` (${stateDetail})` : ''}`,
    '',
    fence,
    last.text,
    fence,
  ];
  if (typeof fromServer === 'string') {
    lines.push('', fromServer);
  } else if (fromServer && typeof fromServer === 'object') {
    const md = (fromServer as { markdown?: unknown }).markdown;
    lines.push('', typeof md === 'string' ? md : '```json\n' + JSON.stringify(fromServer, null, 2) + '\n```');
  } else {
    lines.push('', '_This laya has no `laya/explain` request: only what the editor saw is shown._');
  }
  const doc = await vscode.workspace.openTextDocument({ language: 'markdown', content: lines.join('\n') });
  await vscode.window.showTextDocument(doc, { preview: true, viewColumn: vscode.ViewColumn.Beside });
}

async function menu(context: vscode.ExtensionContext): Promise<void> {
  const pick = await vscode.window.showQuickPick(
    [
      { label: enabled() ? 'Turn inline suggestions off' : 'Turn inline suggestions on', id: 'toggle' },
      { label: 'Explain the last suggestion', id: 'explain' },
      { label: 'Restart the server', id: 'restart' },
      { label: 'Show the log', id: 'log' },
    ],
    { title: `laya: ${modelState}${stateDetail ? ` (${stateDetail})` : ''}` },
  );
  if (pick?.id === 'toggle') await toggle();
  if (pick?.id === 'explain') await explainLastSuggestion();
  if (pick?.id === 'restart') await restart(context);
  if (pick?.id === 'log') output.show();
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel('laya', { log: true });
  status = vscode.window.createStatusBarItem('laya.status', vscode.StatusBarAlignment.Right, 100);
  status.command = 'laya.menu';
  context.subscriptions.push(
    output,
    status,
    vscode.commands.registerCommand('laya.toggle', toggle),
    vscode.commands.registerCommand('laya.explainLastSuggestion', explainLastSuggestion),
    vscode.commands.registerCommand('laya.restart', () => restart(context)),
    vscode.commands.registerCommand('laya.showLog', () => output.show()),
    vscode.commands.registerCommand('laya.menu', () => menu(context)),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (!e.affectsConfiguration('laya')) return;
      renderStatus();
      const needsRestart = ['laya.path', 'laya.model', 'laya.precision', 'laya.remote', 'laya.extraArgs'];
      if (needsRestart.some((s) => e.affectsConfiguration(s))) void restart(context);
    }),
  );
  renderStatus();
  await startClient(context);
}

export async function deactivate(): Promise<void> {
  await client?.stop();
}
