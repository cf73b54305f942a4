"""Secrets read from files, the way containers hand them over: ``<VAR>_FILE`` names a file
whose content is the value of ``<VAR>`` (Docker and Kubernetes secrets mounted as files,
Grafana's ``__FILE``, the official images' ``POSTGRES_PASSWORD_FILE``). A value in the
environment shows in ``docker inspect`` and in ``/proc/<pid>/environ``; a mounted file
does not."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError


class SecretFiles(PydanticBaseSettingsSource):
    """``fields`` of ``settings_cls`` from ``<env_prefix><FIELD>_FILE``; a file's trailing
    newline (which ``echo`` and editors add) is not part of the value. Placed after the
    arguments and before the environment (``settings_customise_sources``): a flag wins over
    a file, which the environment's value may not accompany."""

    def __init__(self, settings_cls: type[BaseSettings], fields: tuple[str, ...]) -> None:
        super().__init__(settings_cls)
        self.fields = fields

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every field at once

    def __call__(self) -> dict[str, Any]:
        prefix = str(self.config.get("env_prefix", "")).upper()
        environ = {k.upper(): v for k, v in os.environ.items()}
        optional = getattr(self.settings_cls, "OPTIONAL_SECRETS", ())
        values: dict[str, Any] = {}
        for name in self.fields:
            var = prefix + name.upper()
            path = environ.get(var + "_FILE")
            if not path:  # unset, or set empty as compose leaves a variable it has no value for
                continue
            if var in environ:
                raise SettingsError(f"{var} and {var}_FILE are both set: keep one (the file keeps the secret out "
                                    "of the environment)")
            value = read_secret(var + "_FILE", path, optional=name in optional)
            if value is not None:
                values[name] = value
        return values


def read_secret(var: str, path: str, *, optional: bool = False) -> str | None:
    """The value the file ``var`` names holds, without its trailing newline (which ``echo``
    and editors add). An empty file, or one of only blanks and commas (a list of no API
    keys), is an error unless ``optional``: compose mounts an empty file for a secret nobody
    configured (deploy/secrets/*.empty), which then stays unset."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise SettingsError(f"{var}: cannot read {path}: {reason}") from None
    value = text.rstrip("\r\n")
    if value.strip(" \t\r\n,"):
        return value
    if optional:
        return None
    raise SettingsError(f"{var}: {path} is empty" if not value.strip() else
                        f"{var}: {path} holds nothing but blanks and commas")


class SecretFileSettings(BaseSettings):
    """Settings whose ``SECRETS`` may each come from ``<env_prefix><FIELD>_FILE``."""

    SECRETS: ClassVar[tuple[str, ...]] = ()
    OPTIONAL_SECRETS: ClassVar[tuple[str, ...]] = ()  # of SECRETS, those an empty file leaves unset

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, SecretFiles(settings_cls, cls.SECRETS), env_settings, dotenv_settings, file_secret_settings
