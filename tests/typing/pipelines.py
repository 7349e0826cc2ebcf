"""Tasks with results, chains, groups and result handles as mypy sees them: a chain's steps must
each take the step before's result, a result handle gives the task's result type, a handler
must return its task's result type, and `sepp.Task[T]` still means a task of T payloads
(test_typing.py: the lines mypy must refuse carry `# type: ignore[code]`)."""

from __future__ import annotations

from dataclasses import dataclass

import sepp


@dataclass
class Image:
    name: str


@dataclass
class Thumb:
    name: str


@dataclass
class Url:
    href: str


resize = sepp.Task("images", "resize", Image, result=Thumb)
upload = sepp.Task("images", "upload", Thumb, result=Url)
notify = sepp.Task("images", "notify", Url)
router = sepp.Router()

as_before: sepp.Task[Image] = resize  # one type parameter: any result, as before results
exact: sepp.Task[Image, Thumb] = resize
no_result: sepp.Task[Url, None] = notify
wrong: sepp.Task[Image, Url] = resize  # type: ignore[assignment]


async def chains(client: sepp.Client) -> None:
    three: sepp.Chain[None] = sepp.chain(resize.job(Image("a")), upload, notify)
    two: sepp.Chain[Url] = sepp.chain(resize.job(Image("a")), upload)
    url: Url = await (await two.submit(client)).result(timeout=10)
    ack: sepp.EnqueueAck = await three.enqueue(client)
    assert url and ack
    sepp.chain(resize.job(Image("a")), notify)  # type: ignore[misc]  # notify takes a Url
    sepp.chain(resize.job(Image("a")), upload, upload)  # type: ignore[misc]
    sepp.chain(resize.job(Thumb("a")), upload)  # type: ignore[arg-type]
    long: sepp.Chain[object] = sepp.chain(
        resize.job(Image("a")), upload, notify, notify, notify, notify, notify
    )  # seven steps and more: checked as they run
    assert long


async def results(client: sepp.Client) -> None:
    handle: sepp.ResultHandle[Thumb] = await resize.submit(client, Image("a"), result_ttl=60)
    thumb: Thumb = await handle.result(timeout=10)
    await (await notify.submit(client, Url("x"))).result()  # None: it ran
    assert thumb
    wrong_type: Url = await handle.result()  # type: ignore[assignment]
    forgot: Thumb = resize.submit(client, Image("a"))  # type: ignore[assignment]
    assert wrong_type and forgot


def blocking(client: sepp.SyncClient) -> None:
    handle: sepp.SyncResultHandle[Thumb] = resize.submit(client, Image("a"))
    thumb: Thumb = handle.result(timeout=10)
    chained: Url = sepp.chain(resize.job(Image("a")), upload).submit(client).result()
    assert thumb and chained


async def groups(client: sepp.Client) -> None:
    both = sepp.group(resize.job(Image("a")), sepp.chain(resize.job(Image("b")), upload))
    pair: tuple[Thumb, Url] = await (await both.submit(client)).result()
    many: tuple[Thumb, ...] = await (
        await sepp.group(*(resize.job(Image(n)) for n in "abcde")).submit(client)
    ).result()
    acks: list[sepp.EnqueueAck] = await both.enqueue(client)
    assert pair and many and acks
    bad: tuple[Url, Url] = await (await both.submit(client)).result()  # type: ignore[assignment]
    assert bad


@router.task(resize)
async def do_resize(image: Image, ctx: sepp.JobContext) -> Thumb:
    ctx.then(notify.job(Url("x")), sepp.EnqueueRequest("audit", "log"))
    ctx.then(sepp.chain(resize.job(image), upload), sepp.group(notify.job(Url("y"))))
    ctx.then(notify)  # type: ignore[arg-type]  # a task, not a job of it
    return Thumb(image.name)


@router.task(upload)
def do_upload(thumb: Thumb, ctx: sepp.SyncJobContext) -> Url:
    ctx.then(notify.job(Url("from a thread")))
    return Url(thumb.name)


@router.task(upload)  # type: ignore[arg-type]
async def returns_the_wrong_type(thumb: Thumb, ctx: sepp.JobContext) -> Thumb:
    return thumb


@router.task(notify)  # type: ignore[arg-type]
async def returns_a_value_for_a_task_without_one(url: Url, ctx: sepp.JobContext) -> Url:
    return url
