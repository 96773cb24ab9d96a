"""Signing up in the browser the way a new user does: the sign-up form, the login form it answers with
(sign-up signs nobody in, so that its answer does not tell who already has an account), then the first page of
a new account, "connect OpenClaw"."""

from pathlib import Path


def sign_up(page, url: str, email: str, password: str, *, screenshot: Path | None = None) -> None:
    page.goto(f"{url}/signup/")
    page.fill("input[name=email]", email)
    page.fill("input[name=new_password1]", password)
    page.fill("input[name=new_password2]", password)
    page.click("main button[type=submit]")
    page.locator("#signed-up").wait_for()
    assert email in page.inner_text("#signed-up")
    # The address is filled in and the cursor waits in the password field.
    assert page.input_value("input[name=email]") == email
    assert page.evaluate("document.activeElement.name") == "password"
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True)
    page.fill("input[name=password]", password)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{url}/onboarding/")
