"""The operator's message policies as the node keeps them (see adapter/policies)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .models import Base


class PolicyRuleRow(Base):
    """One top-level policy element (a rule, policy or policy set) as its JSON document."""

    __tablename__ = "policy_rules"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Creation order: elements of equal priority are evaluated in it.
    position: Mapped[int] = mapped_column(BigInteger, unique=True)
    document: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class PolicySetting(Base):
    """Settings of the rule engine by name (the top-level combining algorithm)."""

    __tablename__ = "policy_settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
