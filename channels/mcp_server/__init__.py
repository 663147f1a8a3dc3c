"""MCP server (`/mcp`, streamable HTTP): other tools ask chatgate's agent and read its sessions."""

from app.channel import ChannelSpec
from channels.mcp_server.adapter import McpServerChannel
from channels.mcp_server.settings import McpServerSettings

CHANNEL = ChannelSpec(name="mcp", settings_class=McpServerSettings, factory=McpServerChannel)

__all__ = ["CHANNEL", "McpServerChannel", "McpServerSettings"]
