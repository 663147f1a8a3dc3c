// English and Chinese for the dashboard. The language is the user's pick (remembered),
// else the browser's (navigator.languages, which follows Accept-Language), else English.
// Keys are the English texts, so a missing translation shows English, never a key.

const KEY = "chatgate.lang";

const ZH = {
  "Personal WeChat login": "个人微信登录",
  "Log in with a QR code": "扫码登录",
  "Scan the code with WeChat and confirm on the phone.": "用微信扫描二维码，并在手机上确认。",
  "WeChat login QR code": "微信登录二维码",
  "Overview": "概览",
  "Usage": "用量",
  "Period": "时间段",
  "Today": "今天",
  "7 days": "7 天",
  "30 days": "30 天",
  "90 days": "90 天",
  "Model calls": "模型调用",
  "Input tokens": "输入令牌",
  "Output tokens": "输出令牌",
  "{n} cached": "其中缓存 {n}",
  "Speech to text": "语音转写",
  "Cost": "费用",
  "no price known for these models": "这些模型没有已知价格",
  "Tokens per day": "每日令牌",
  "Cost per day ({c})": "每日费用（{c}）",
  "Budgets": "预算",
  "No budgets set (USAGE_BUDGETS).": "未设置预算（USAGE_BUDGETS）。",
  "{scope} budget, {period}: {limit} {unit} each": "{scope}预算，{period}：每个 {limit} {unit}",
  "sender": "发送者",
  "chat": "聊天",
  "agent": "助手",
  "deployment": "整个部署",
  "whole deployment": "整个部署",
  "today": "今日",
  "this month": "本月",
  "tokens": "令牌",
  "Nothing used yet.": "尚未使用。",
  "Nothing in this period.": "此时间段内没有用量。",
  "Top sessions": "用量最多的会话",
  "Top senders": "用量最多的发送者",
  "Top chats": "用量最多的聊天",
  "Top agents": "用量最多的助手",
  "Models": "模型",
  "Sender": "发送者",
  "Chat": "聊天",
  "Agent": "助手",
  "Calls": "调用",
  "Tokens in / out": "令牌 输入 / 输出",
  "Speech": "语音",
  "Sessions": "会话",
  "Runs": "运行",
  "Approvals": "审批",
  "Dead letters": "死信",
  "Access": "访问",
  "Cron jobs": "定时任务",
  "Channels": "渠道",
  "Configuration": "配置",
  "Log out": "退出登录",
  "just now": "刚刚",
  "{span} ago": "{span}前",
  "in {span}": "{span}后",
  "Sign in": "登录",
  "Admin token": "管理令牌",
  "Enter the service's ADMIN_TOKEN. You stay signed in for 12 hours (an HttpOnly cookie).":
    "输入服务的 ADMIN_TOKEN。登录状态保持 12 小时（HttpOnly Cookie）。",
  "Wrong token.": "令牌错误。",
  "Switch to dark theme": "切换到深色主题",
  "Switch to light theme": "切换到浅色主题",
  "中文": "中文",
  "English": "English",
  "Window": "时间窗口",
  "15 min": "15 分钟",
  "1 hour": "1 小时",
  "6 hours": "6 小时",
  "24 hours": "24 小时",
  "Active sessions": "活跃会话",
  "Suspended": "已挂起",
  "Expired": "已过期",
  "{n} archived": "{n} 个已归档",
  "Events / min": "事件 / 分钟",
  "{a} in window · {b} this minute": "窗口内 {a} · 本分钟 {b}",
  "Run latency p50": "运行延迟 p50",
  "p95 {a} · {b} runs": "p95 {a} · {b} 次运行",
  "Inbox backlog": "收件箱积压",
  "events not processed yet": "尚未处理的事件",
  "Outbox backlog": "发件箱积压",
  "replies not delivered yet": "尚未送达的回复",
  "Failures": "失败",
  "{a} runs · {b} events · {c} deliveries": "{a} 次运行 · {b} 个事件 · {c} 次投递",
  "Events per minute": "每分钟事件",
  "Run latency (avg per minute)": "运行延迟（每分钟平均）",
  "Replies delivered per minute": "每分钟送达回复",
  "Failures per minute": "每分钟失败",
  "Updated {t} · live": "更新于 {t} · 实时",
  "live": "实时",
  "offline": "离线",
  "Search key or message text": "搜索键或消息内容",
  "Key prefix": "键前缀",
  "All channels": "全部渠道",
  "Any status": "任意状态",
  "include archived": "包括已归档",
  "Filter": "筛选",
  "Key": "键",
  "Channel": "渠道",
  "Status": "状态",
  "Gen": "代",
  "Messages": "消息",
  "Last active": "最后活跃",
  "Title": "标题",
  "Name": "名称",
  "Value": "值",
  "Environment variable": "环境变量",
  "secret": "机密",
  "not set": "未设置",
  "default": "默认",
  "Read only. Settings come from the environment (or .env) at start-up; secrets are never shown.":
    "只读。设置在启动时读取自环境变量（或 .env）；机密从不显示。",
  "The server answered {s}: {d}": "服务器返回 {s}：{d}",
  "The admin API is disabled on this server: set ADMIN_TOKEN and restart.":
    "此服务器未启用管理 API：请设置 ADMIN_TOKEN 并重启。",
  // empty states
  "No sessions yet": "还没有会话",
  "A session starts with the first message on any channel. Open the chat page (/) with a gateway token, or send a signed webhook, then come back.":
    "任意渠道收到第一条消息时会创建会话。用网关令牌打开聊天页（/），或发送一个签名的 webhook，然后回到这里。",
  "No sessions match": "没有匹配的会话",
  "Clear the filters or search for part of a key.": "清除筛选条件，或搜索键的一部分。",
  "No runs yet": "还没有运行记录",
  "A run is one answer of the model. Send a message on any channel and its run appears here with model, tokens and tool calls.":
    "一次运行就是模型的一次回答。在任意渠道发送消息，其运行（模型、令牌数、工具调用）会显示在这里。",
  "No approval requests": "没有审批请求",
  "Tools marked risky ask before they run. Their requests, and who approved or denied them, are listed here.":
    "标记为有风险的工具在运行前会请求批准。请求以及批准或拒绝的人会列在这里。",
  "No dead letters": "没有死信",
  "Events and replies that failed every retry land here, to be retried or discarded. Nothing has failed.":
    "所有重试都失败的事件和回复会进入这里，可重试或丢弃。目前没有失败。",
  "No cron jobs": "没有定时任务",
  "No model calls in this period": "此时间段内没有模型调用",
  "Every model call is counted with its tokens and cost as it happens (and each voice note transcribed, with its seconds). Send a message on any channel, or pick a longer period.":
    "每次模型调用发生时都会记录其令牌和费用（每条转写的语音也会记录秒数）。在任意渠道发送一条消息，或选择更长的时间段。",
  "Ask the assistant to remind you of something (\"remind me in 10 minutes\"), or add CRON to CHANNELS; scheduled jobs are listed here.":
    "让助手提醒你某件事（“10 分钟后提醒我”），或在 CHANNELS 中加入 cron；定时任务会列在这里。",
  "No channels": "没有渠道",
  "Enable channels with CHANNELS=webhook,browser,… and restart.": "用 CHANNELS=webhook,browser,… 启用渠道并重启。",
  "Adapter": "适配器",
  "Any outcome": "任意结果",
  "Archive": "归档",
  "Arguments": "参数",
  "Attempts": "尝试次数",
  "Call id": "调用 ID",
  "Connection owner": "连接持有者",
  "Decided": "决定时间",
  "Details": "详情",
  "Discard": "丢弃",
  "Discard all": "全部丢弃",
  "Discard all matching": "丢弃全部匹配项",
  "Duration": "耗时",
  "Error": "错误",
  "Events and deliveries": "事件和投递",
  "Failed": "失败时间",
  "Failed in / out": "失败 入 / 出",
  "Generation": "代",
  "Health": "健康状态",
  "Id": "ID",
  "Kind": "类型",
  "Last": "上次",
  "Last error": "最近错误",
  "Last inbound": "最近收到",
  "Last outbound": "最近发出",
  "Messages appended by this run": "本次运行追加的消息",
  "Model": "模型",
  "Next": "下次",
  "No approval requests.": "没有审批请求。",
  "No runs yet.": "还没有运行记录。",
  "No tool calls.": "没有工具调用。",
  "None.": "无。",
  "Older runs →": "更早的运行 →",
  "Outcome": "结果",
  "Pending in / out": "待处理 入 / 出",
  "Recent in / out": "近期 入 / 出",
  "Requested": "请求时间",
  "Reset": "重置",
  "Reset is still queued.": "重置仍在排队。",
  "Retry": "重试",
  "Retry all": "全部重试",
  "Retry all matching": "重试全部匹配项",
  "Run": "运行",
  "Schedule": "计划",
  "Scope · busy": "范围 · 忙碌策略",
  "Session": "会话",
  "Session is now {status}.": "会话现在是 {status}。",
  "Session key": "会话键",
  "Started": "开始时间",
  "State": "状态",
  "Steps": "步数",
  "Target": "目标",
  "Text": "文本",
  "Time": "时间",
  "Tokens in / out": "令牌 入 / 出",
  "Tool": "工具",
  "Tool calls": "工具调用",
  "Retried {n} dead letter(s).": "已重试 {n} 条死信。",
  "Discarded {n} dead letter(s).": "已丢弃 {n} 条死信。",
  // The chat page.
  "Enter a gateway token. It decides which conversations you may open.": "输入网关令牌。它决定你可以打开哪些会话。",
  "A link can carry it as": "链接中也可以带上它：",
  "Gateway token": "网关令牌",
  "Connect": "连接",
  "connecting…": "连接中…",
  "connected": "已连接",
  "reconnecting…": "重新连接中…",
  "reconnecting in {n} s…": "{n} 秒后重新连接…",
  "Stop": "停止",
  "Cancel the running answer (/stop)": "取消正在生成的回答（/stop）",
  "Sign out": "退出",
  "Forget the token in this tab": "在此标签页中忘记令牌",
  "Message… (Enter sends, Shift+Enter for a new line)": "输入消息…（Enter 发送，Shift+Enter 换行）",
  "Send": "发送",
  "running…": "运行中…",
  "waiting for the result…": "等待结果…",
  "Tool call": "工具调用",
  "arguments": "参数",
  "result": "结果",
  "error": "出错",
  "done": "完成",
  "a tool": "某个工具",
  "approval sent…": "已发送批准…",
  "denial sent…": "已发送拒绝…",
  "Approval needed: {tool}": "需要审批：{tool}",
  "Denied automatically at {time}.": "将于 {time} 自动拒绝。",
  "Approve": "批准",
  "Deny": "拒绝",
  "waiting for approval": "等待审批",
  "+ new conversation": "+ 新会话",
  "+ new conversation under {prefix}": "+ 在 {prefix} 下新建会话",
  "Opening {key}…": "正在打开 {key}…",
  "The browser gateway is not enabled on this server (CHANNELS must include browser).":
    "此服务器未启用浏览器网关（CHANNELS 需要包含 browser）。",
  "The last conversation in {key} has ended. Say hello to start a new one.": "{key} 中的上一个会话已结束。打个招呼即可开始新会话。",
  "This is {key}. Say hello.": "这是 {key}。打个招呼吧。",
  "Some older messages are not shown.": "更早的消息未显示。",
  "— new conversation —": "— 新会话 —",
  "The token has expired.": "令牌已过期。",
  "The gateway refused this token.": "网关拒绝了此令牌。",
  // The session page.
  "generation {g} · {status} · {n} msgs": "第 {g} 代 · {status} · {n} 条消息",
  "generation {g} · {status} (current) · {n} msgs": "第 {g} 代 · {status}（当前）· {n} 条消息",
  "Reopen generation {g}": "重新打开第 {g} 代",
  "channel {name}": "渠道 {name}",
  "generation {a} of {b}": "第 {a} 代，共 {b} 代",
  "{n} messages": "{n} 条消息",
  "{n} runs": "{n} 次运行",
  "inbox pending {n}": "收件箱待处理 {n}",
  "outbox pending {n}": "发件箱待发送 {n}",
  "last active": "最近活跃",
  "lease {owner} (fence {fence})": "租约 {owner}（fence {fence}）",
  "Showing generation {g} ({status}); the current one is {c}.": "正在查看第 {g} 代（{status}）；当前为第 {c} 代。",
  "History ({n} messages)": "历史（{n} 条消息）",
  "Reset queued behind the session's events…": "重置已排在该会话的事件之后…",
  "Reset failed: {error}": "重置失败：{error}",
  "Archived.": "已归档。",
  "Archive failed: {error}": "归档失败：{error}",
  "Generation {g} is current again.": "第 {g} 代已重新成为当前代。",
  "Reopen failed: {error}": "重新打开失败：{error}",
  "active": "活跃",
  "suspended": "已挂起",
  "expired": "已过期",
  "archived": "已归档",
  "user": "用户",
  "assistant": "助手",
  "tool": "工具",
  "system": "系统",
  "run #{id}": "运行 #{id}",
  "result of {id} (call not in view)": "{id} 的结果（调用不在视图中）",
  "+ {n} attachment(s): {types}": "+ {n} 个附件：{types}",
  "tool calls ({n})": "工具调用（{n}）",
  "result #{seq}": "结果 #{seq}",
  "no result recorded (interrupted run?)": "没有记录结果（运行被中断？）",
  "No messages in this generation.": "这一代没有消息。",

};

const DICTS = { en: {}, zh: ZH };

export function detectLang() {
  const stored = localStorage.getItem(KEY);
  if (stored === "en" || stored === "zh") return stored;
  const langs = navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language || "en"];
  for (const l of langs) {
    const base = String(l).toLowerCase().split("-")[0];
    if (base === "zh") return "zh";
    if (base === "en") return "en";
  }
  return "en";
}

let lang = detectLang();

export const currentLang = () => lang;

export function setLang(next) {
  lang = next === "zh" ? "zh" : "en";
  localStorage.setItem(KEY, lang);
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
}

/** t("{n} archived", {n: 3}) */
export function t(text, params) {
  let out = DICTS[lang][text] ?? text;
  for (const [k, v] of Object.entries(params || {})) out = out.replaceAll(`{${k}}`, String(v));
  return out;
}

/** Translate the static page: [data-i18n] text, [data-i18n-placeholder] placeholders. */
export function translateStatic(root = document) {
  for (const el of root.querySelectorAll("[data-i18n]")) {
    el.dataset.i18nSource ??= el.dataset.i18n || el.textContent.trim();
    el.textContent = t(el.dataset.i18nSource);
  }
  for (const el of root.querySelectorAll("[data-i18n-placeholder]")) {
    el.placeholder = t(el.dataset.i18nPlaceholder);
  }
  for (const el of root.querySelectorAll("[data-i18n-title]")) {
    el.title = t(el.dataset.i18nTitle);
  }
}

document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
