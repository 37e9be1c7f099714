"""The cloud port osas needs from OpenStack, and its adapters (in-memory fake, openstacksdk)."""
