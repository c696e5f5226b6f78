"""Dashboard roles: with a viewer's credentials the silence form is refused; with an operator's it is accepted.

Roles come from the basic-auth file (``user:hash:operator``) or from a header that the site's reverse proxy sets
(``--role-header``). The accepted silence is stored in the SQL store, as ``gpulens silence add`` stores it.
"""

from __future__ import annotations

from pathlib import Path

import bcrypt
import pytest

from gpulens.config import ConfigError
from gpulens.dashboard.app import create_app
from gpulens.dashboard.server import load_basic_auth_file, silence_writer
from gpulens.storage import alertstore
from gpulens.storage.db import Database
from gpulens.webroles import OPERATOR, VIEWER, RolePolicy

FORM = {"matchers": "alertname=GpuMemorySaturated, node=gpu-07", "duration": "2h", "comment": "maintenance"}
ORIGIN = {"Origin": "http://localhost"}


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


@pytest.fixture
def users(tmp_path: Path) -> Path:
    path = tmp_path / "htpasswd"
    path.write_text(f"vera:{_hash('v-pw')}\nolga:{_hash('o-pw')}:operator\nwill:{_hash('w-pw')}:viewer\n")
    return path


def test_the_auth_file_gives_each_user_a_role(users: Path, tmp_path: Path) -> None:
    auth = load_basic_auth_file(users)
    assert auth.roles == {"vera": VIEWER, "olga": OPERATOR, "will": VIEWER}
    bad = tmp_path / "bad"
    bad.write_text(f"root:{_hash('x')}:admin\n")
    with pytest.raises(ConfigError) as caught:
        load_basic_auth_file(bad)
    assert caught.value.line == 1
    assert "expected the role viewer or operator" in str(caught.value)


def test_a_viewer_is_refused_and_an_operator_silences(empty_db: Database, users: Path) -> None:
    app = create_app(empty_db, basic_auth=load_basic_auth_file(users), silences=silence_writer(empty_db))
    client = app.server.test_client()
    assert client.get("/alerts", auth=("vera", "v-pw")).status_code == 200  # a viewer reads
    refused = client.post("/silences", data=FORM, headers=ORIGIN, auth=("vera", "v-pw"))
    assert refused.status_code == 403
    assert refused.get_data(as_text=True) == "silencing needs the operator role; this visitor is a viewer\n"
    assert client.post("/silences", data=FORM, headers=ORIGIN).status_code == 401  # no credentials at all
    now = empty_db.clock.now()
    assert alertstore.list_silences(empty_db, now=now) == []

    accepted = client.post("/silences", data=FORM, headers=ORIGIN, auth=("olga", "o-pw"))
    assert accepted.status_code == 303
    assert accepted.headers["Location"].endswith("/alerts")
    [silence] = alertstore.list_silences(empty_db, now=now)
    assert [(m["name"], m["op"], m["value"]) for m in silence.matchers] == [
        ("alertname", "=", "GpuMemorySaturated"),
        ("node", "=", "gpu-07"),
    ]
    assert (silence.created_by, silence.comment, silence.ends_at - silence.starts_at) == ("olga", "maintenance", 7200)


@pytest.mark.parametrize(
    ("form", "headers", "status", "line"),
    [
        ({**FORM, "duration": "soon"}, ORIGIN, 400, "duration:"),
        ({**FORM, "matchers": "node=~("}, ORIGIN, 400, "matchers:"),
        ({**FORM, "comment": " "}, ORIGIN, 400, "comment: required"),
        (FORM, {}, 403, "a silence must be posted from the dashboard's own page"),
        (FORM, {"Origin": "http://evil.example"}, 403, "a silence must be posted from the dashboard's own page"),
    ],
)
def test_bad_posts_are_refused_in_one_line(
    empty_db: Database, users: Path, form: dict[str, str], headers: dict[str, str], status: int, line: str
) -> None:
    app = create_app(empty_db, basic_auth=load_basic_auth_file(users), silences=silence_writer(empty_db))
    answer = app.server.test_client().post("/silences", data=form, headers=headers, auth=("olga", "o-pw"))
    assert answer.status_code == status
    assert answer.get_data(as_text=True).startswith(line)
    assert answer.get_data(as_text=True).count("\n") == 1
    assert alertstore.list_silences(empty_db, now=empty_db.clock.now()) == []


def test_the_proxys_header_gives_the_role(empty_db: Database) -> None:
    policy = RolePolicy(header="X-Gpulens-Role")
    app = create_app(empty_db, roles=policy, silences=silence_writer(empty_db))
    client = app.server.test_client()
    viewer = client.post("/silences", data=FORM, headers={**ORIGIN, "X-Gpulens-Role": "viewer"})
    assert viewer.status_code == 403
    assert client.post("/silences", data=FORM, headers=ORIGIN).status_code == 403  # no header: a viewer
    operator = client.post("/silences", data=FORM, headers={**ORIGIN, "x-gpulens-role": "operator"})
    assert operator.status_code == 303
    assert len(alertstore.list_silences(empty_db, now=empty_db.clock.now())) == 1


def test_the_alerts_page_shows_the_form() -> None:
    from gpulens.dashboard.silenceform import silence_form

    form = silence_form().to_plotly_json()
    assert (form["props"]["action"], form["props"]["method"]) == ("/silences", "POST")
    names = [child.to_plotly_json()["props"].get("name") for child in form["props"]["children"]]
    assert names[:3] == ["matchers", "duration", "comment"]
