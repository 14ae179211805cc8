"""DeepEval's `evaluate()` configuration objects, so code written for DeepEval runs unchanged.

What makes sense locally is honoured (concurrency, printing, verbose logs, raising on errors, skipping cases
a metric cannot score); what would change results in a way tracejudge cannot do (throttling, a result cache,
files of results) is refused with a `ValueError` that says what to do instead, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AsyncConfig:
    run_async: bool = True
    throttle_value: float = 0
    max_concurrent: int = 20


@dataclass
class DisplayConfig:
    show_indicator: bool = True
    print_results: bool = True
    verbose_mode: bool | None = None
    display_option: str | None = None
    file_output_dir: str | None = None


@dataclass
class ErrorConfig:
    ignore_errors: bool = False
    skip_on_missing_params: bool = False


@dataclass
class CacheConfig:
    write_cache: bool = True
    use_cache: bool = False


@dataclass(frozen=True)
class RunSettings:
    """What the configs mean for one `evaluate()` run."""

    max_concurrency: int
    print_results: bool
    verbose_mode: bool | None
    raise_errors: bool
    skip_without_task: bool


def run_settings(async_config: AsyncConfig | None, display_config: DisplayConfig | None,
                 error_config: ErrorConfig | None, cache_config: CacheConfig | None, *, max_concurrency: int,
                 print_results: bool) -> RunSettings:
    """The run's settings from DeepEval's configs (each given one wins over the keyword it stands for)."""
    if async_config is not None:
        if async_config.throttle_value:
            raise ValueError("AsyncConfig(throttle_value=...) is not supported: lower max_concurrent instead (judge "
                             "calls already retry with backoff and honour Retry-After)")
        max_concurrency = async_config.max_concurrent if async_config.run_async else 1
    if display_config is not None:
        if display_config.file_output_dir is not None:
            raise ValueError("DisplayConfig(file_output_dir=...) is not supported: save "
                             "result.model_dump_json() yourself, or score through the collector to keep history")
        if display_config.display_option is not None:
            raise ValueError("DisplayConfig(display_option=...) is not supported: every result is printed; "
                             "filter result.test_results instead")
        print_results = display_config.print_results
    if cache_config is not None and cache_config.use_cache:
        raise ValueError("CacheConfig(use_cache=True) is not supported: tracejudge keeps no result cache "
                         "(set write_cache=False and use_cache=False)")
    if cache_config is not None and cache_config.write_cache:
        raise ValueError("CacheConfig(write_cache=True) is not supported: tracejudge keeps no result cache "
                         "(set write_cache=False)")
    return RunSettings(max_concurrency=max_concurrency, print_results=print_results,
                       verbose_mode=display_config.verbose_mode if display_config else None,
                       raise_errors=error_config is not None and not error_config.ignore_errors,
                       skip_without_task=error_config is not None and error_config.skip_on_missing_params)
