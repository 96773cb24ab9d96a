from clawhub.tenants import naming


def test_model_ids_and_upstream_names():
    assert naming.tenant_model_id(group_slug=None) == "clawhub-personal"
    assert naming.tenant_model_id(group_slug="ml") == naming.group_model_id("ml") == "clawhub-group-ml"
    assert naming.upstream_adapter_name(tenant_id=7, version=3) == "t7-v3"
    assert naming.models_offered(tenant_model_id="clawhub-personal") == ["clawhub-personal", "base"]


def test_models_for_key_narrows_to_the_allowed_ones():
    group = "clawhub-group-a"
    assert naming.models_for_key(tenant_model_id=group, allowed_models=[]) == [group, "base"]
    assert naming.models_for_key(tenant_model_id=group, allowed_models=None) == [group, "base"]
    assert naming.models_for_key(tenant_model_id=group, allowed_models=["base"]) == ["base"]


def test_model_access_tells_not_allowed_from_not_found():
    def access(model, allowed=()):
        return naming.model_access(model=model, tenant_model_id="clawhub-group-a", allowed_models=allowed)

    assert access("clawhub-group-a") == access("base") == "ok"
    assert access("clawhub-group-b") == access("clawhub-personal") == "not_allowed"  # another tenant's
    assert access("base", allowed=["clawhub-group-a"]) == "not_allowed"
    assert access("clawhub-group-a", allowed=["base"]) == "not_allowed"
    assert access("gpt-4o") == "not_found"


def test_metric_labels_fold_group_ids():
    models = ("clawhub-group-x", "clawhub-personal", "base", "gpt-4o", None)
    labels = ["clawhub-group", "clawhub-personal", "base", "other", "none"]
    assert [naming.metric_label(m) for m in models] == labels
