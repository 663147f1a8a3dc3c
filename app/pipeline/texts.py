"""What the gateway itself says in chats, in each language it speaks (`en`, `zh`).

The locale is the channel's (`<CHANNEL>_LOCALE`), else English. Add a text here with
both languages; `say` falls back to English for a locale without it.
"""

from __future__ import annotations

from typing import Any

TEXTS: dict[str, dict[str, str]] = {
    "new.done": {"en": "Started a new conversation.", "zh": "已开始新的对话。"},
    "reset.done": {
        "en": "The conversation was reset. Earlier messages are kept but no longer used.",
        "zh": "对话已重置。之前的消息仍保留，但不再使用。",
    },
    "end.done": {
        "en": "Conversation ended. Send a message to start a new one.",
        "zh": "对话已结束。发送消息即可开始新的对话。",
    },
    "stop.nothing": {"en": "Nothing is running.", "zh": "当前没有正在运行的任务。"},
    "failed": {"en": "Sorry, I could not process your message.", "zh": "抱歉，无法处理你的消息。"},
    "not_allowed": {"en": "You are not allowed to use {command} here.", "zh": "你无权在此使用 {command}。"},
    "role_needed": {
        "en": "Only {role} of this group may use {command}; nothing was changed.",
        "zh": "只有本群的{role}可以使用 {command}，未做任何更改。",
    },
    "role.owner": {"en": "the owner", "zh": "群主"},
    "role.admin": {"en": "admins", "zh": "管理员"},
    "role.member": {"en": "members", "zh": "成员"},
    "role.guest": {"en": "guests", "zh": "访客"},
    "help.title": {"en": "Commands:", "zh": "可用命令："},
    "none": {"en": "none", "zh": "无"},
    "untitled": {"en": "(untitled)", "zh": "（无标题）"},
    "status": {
        "en": "Session {session_key}\nAgent: {agent}\nGeneration: {generation}\nTitle: {title}\n"
        "Model: {model}\nWindow: {messages} messages, about {tokens} tokens\nLoaded skills: {skills}\n"
        "Pending approvals: {pending}",
        "zh": "会话 {session_key}\n智能体：{agent}\n代数：{generation}\n标题：{title}\n模型：{model}\n"
        "上下文：{messages} 条消息，约 {tokens} 个 token\n已加载技能：{skills}\n待审批：{pending}",
    },
    "whoami": {
        "en": "Channel: {channel}\nYou: {sender}\nChat: {chat} ({chat_type})\nSession key: {session_key}",
        "zh": "渠道：{channel}\n你：{sender}\n聊天：{chat}（{chat_type}）\n会话键：{session_key}",
    },
    "title.show": {"en": "Title: {title}", "zh": "标题：{title}"},
    "title.set": {"en": "Title set to: {title}", "zh": "标题已设为：{title}"},
    "title.too_long": {
        "en": "A title has at most {max} characters.",
        "zh": "标题最多 {max} 个字符。",
    },
    "model.show": {
        "en": "Model: {model}\nAvailable: {models}",
        "zh": "当前模型：{model}\n可用模型：{models}",
    },
    "model.set": {"en": "This conversation now uses {model}.", "zh": "当前对话已切换到 {model}。"},
    "model.unknown": {
        "en": "{model} is not available here. Available: {models}",
        "zh": "此处不可使用 {model}。可用模型：{models}",
    },
    "sessions.title": {"en": "Conversations in this chat (* current):", "zh": "此聊天中的对话（* 为当前）："},
    "sessions.elsewhere": {
        "en": "In your other chats on {channel} (/resume works in the chat itself):",
        "zh": "你在 {channel} 上其他聊天中的对话（/resume 需在对应聊天中使用）：",
    },
    "sessions.in_chat": {"en": "- {chat}: {line}", "zh": "- {chat}：{line}"},
    "sessions.from": {"en": ", from {n}", "zh": "，接续自 {n}"},
    "sessions.line": {
        "en": "{n}. {title} — {messages} messages, {status}",
        "zh": "{n}. {title} — {messages} 条消息，{status}",
    },
    "resume.unknown": {
        "en": "There is no conversation {n} here. /sessions lists them.",
        "zh": "此处没有第 {n} 个对话。使用 /sessions 查看列表。",
    },
    "resume.archived": {
        "en": "Conversation {n} is archived and cannot be continued.",
        "zh": "第 {n} 个对话已归档，无法继续。",
    },
    "undo.done": {
        "en": "Took back the last exchange. It stays in the history, marked undone.",
        "zh": "已撤回上一轮对话。它仍保留在历史中，标记为已撤回。",
    },
    "undo.nothing": {"en": "There is nothing to take back.", "zh": "没有可以撤回的内容。"},
    "retry.nothing": {"en": "There is no message to answer again.", "zh": "没有可以重新回答的消息。"},
    "compact.done": {
        "en": "Summarized conversation {old} ({summaries} summaries) and continued in conversation {new}.",
        "zh": "已总结第 {old} 个对话（{summaries} 条摘要），并在第 {new} 个对话中继续。",
    },
    "compact.nothing": {"en": "There is nothing to compact yet.", "zh": "目前没有可压缩的内容。"},
    "compact.unavailable": {
        "en": "Compacting needs memory and consolidation, which are off here.",
        "zh": "压缩需要启用记忆与整理功能，此处未启用。",
    },
    "agent.title": {"en": "Agents (* serving this chat):", "zh": "智能体（* 为当前）："},
    "agent.unknown": {
        "en": "There is no agent {agent} you may use. Yours: {agents}",
        "zh": "没有你可使用的智能体 {agent}。可用：{agents}",
    },
    "agent.switched": {
        "en": "This chat now talks to {agent}. Each agent keeps its own conversation.",
        "zh": "此聊天已切换到 {agent}。每个智能体保留各自的对话。",
    },
    "skills.title": {"en": "Skills (* loaded here):", "zh": "技能（* 为已在此加载）："},
    "skill.unknown": {
        "en": "There is no skill {skill}. Available: {skills}",
        "zh": "没有名为 {skill} 的技能。可用：{skills}",
    },
    "skill.loaded": {
        "en": "Skill {skill} loaded here.",
        "zh": "已在当前对话加载技能 {skill}。",
    },
    "skill.unloaded": {"en": "Skill {skill} unloaded.", "zh": "已卸载技能 {skill}。"},
    "skill.not_loaded": {"en": "Skill {skill} was not loaded.", "zh": "技能 {skill} 未加载。"},
    "link.code": {
        "en": "Your link code: {code}\nSend /link {code} from your other account within {minutes} minutes.",
        "zh": "你的关联码：{code}\n请在 {minutes} 分钟内从你的另一个账号发送 /link {code}。",
    },
    "link.direct_only": {
        "en": "Use /link in a direct chat with me.",
        "zh": "请在与我的私聊中使用 /link。",
    },
    "link.bad_code": {
        "en": "That code is unknown, used or expired. Send /link on your other account for a new one.",
        "zh": "该关联码无效、已使用或已过期。请在另一个账号上发送 /link 获取新的关联码。",
    },
    "link.too_many": {
        "en": "Too many tries with a code. Please wait up to {minutes} minutes and try again.",
        "zh": "关联码尝试次数过多。请最多等待 {minutes} 分钟后再试。",
    },
    "link.same": {"en": "That code came from this account itself.", "zh": "该关联码来自此账号本身。"},
    "link.done": {
        "en": "Linked: your accounts now share your memory. /unlink undoes it.",
        "zh": "已关联：你的账号现在共享记忆。发送 /unlink 可取消。",
    },
    "unlink.done": {"en": "This account is no longer linked.", "zh": "此账号已取消关联。"},
    "unlink.none": {"en": "This account is not linked.", "zh": "此账号没有关联。"},
    "handoff.usage": {
        "en": "Usage: /handoff CHANNEL (e.g. /handoff telegram) or /handoff back",
        "zh": "用法：/handoff 渠道（例如 /handoff telegram）或 /handoff back",
    },
    "handoff.done": {
        "en": "This conversation now continues in your direct chat on {channel}.",
        "zh": "当前对话将在你于 {channel} 上的私聊中继续。",
    },
    "handoff.back": {
        "en": "Handed back: each chat has its own conversation again.",
        "zh": "已交回：各聊天重新拥有各自的对话。",
    },
    "handoff.arrived": {
        "en": "This conversation continues here, handed off from {channel}. Send /handoff back to return it.",
        "zh": "这段对话已从 {channel} 转到这里继续。发送 /handoff back 可将其转回。",
    },
    "handoff.back_here": {
        "en": "The conversation is back here, handed back from {channel}.",
        "zh": "对话已从 {channel} 转回这里。",
    },
    "handoff.back_away": {
        "en": "The conversation went back to {channel}; this chat has its own conversation again.",
        "zh": "对话已转回 {channel}，这个聊天重新拥有自己的对话。",
    },
    "handoff.none": {"en": "This conversation is not handed off.", "zh": "当前对话没有转交。"},
    "handoff.here": {"en": "You are on {channel} already.", "zh": "你已经在 {channel} 上了。"},
    "handoff.not_linked": {
        "en": "You have no account on {channel} linked to this one. Use /link first.",
        "zh": "你没有与此账号关联的 {channel} 账号。请先使用 /link。",
    },
    "handoff.say_hi": {
        "en": "Send me a direct message on {channel} first, then /handoff {channel} again.",
        "zh": "请先在 {channel} 上给我发一条私信，然后再次发送 /handoff {channel}。",
    },
    "context.too_long": {
        "en": "Your message is too long for this model's context. Please send a shorter one.",
        "zh": "你的消息超出了此模型的上下文长度，请发送更短的消息。",
    },
    "resume.done": {"en": "Continuing conversation {n}: {title}", "zh": "继续第 {n} 个对话：{title}"},
}

LOCALES = ("en", "zh")


def say(key: str, locale: str = "en", **values: Any) -> str:
    """The text `key` in `locale` (English if it has none), with `values` filled in."""
    texts = TEXTS[key]
    return texts.get(locale, texts["en"]).format(**values)
