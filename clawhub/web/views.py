from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render


def home(request):
    if request.user.is_authenticated:
        return redirect("dashboard")
    return render(request, "web/home.html")


@login_required
def dashboard(request):
    from clawhub.bench.progress import adapter_progress, bench_plot_data_uri
    from clawhub.groups.selectors import groups_for_user
    from clawhub.keys.selectors import keys_for_user

    return render(request, "web/dashboard.html", {
        "keys": keys_for_user(user=request.user)[:10],
        "groups": groups_for_user(user=request.user),
        "progress": adapter_progress(user=request.user),
        "bench_plot": bench_plot_data_uri(),
    })
