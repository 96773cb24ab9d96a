"""The registry of which upstream holds which adapter moved from the gateway app to adapters by state alone
(adapters 0004, gateway 0002): a database migrated before the move keeps its tables and rows, which the
adapters app's models then read."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("adapters", "0003_gate_and_sweeper"), ("gateway", "0001_initial")]


@pytest.mark.slow  # migrates the test database back and forth: about 15 s
@pytest.mark.django_db(transaction=True)
def test_rows_written_before_the_move_are_read_after_it():
    from clawhub.adapters.models import LoadedAdapter, Upstream

    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    upstream = old.get_model("gateway", "Upstream").objects.create(
        url="http://vllm-a:8000", base_model="tiny", healthy=True)
    old.get_model("gateway", "LoadedAdapter").objects.create(upstream_id=upstream.pk, adapter_name="t1-v1")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert list(LoadedAdapter.objects.values_list("upstream__url", "adapter_name")) == [
        ("http://vllm-a:8000", "t1-v1")]
    assert Upstream.objects.get().healthy
    assert Upstream._meta.db_table == "gateway_upstream"  # the same table, not a copy
