"""Every place the reference engine reaches into h2's internals, in one subclass.

h2 is a general-purpose state machine; these overrides bend it to what a unary gRPC client
needs. Each one depends on h2 internals (checked on the declared floor and the newest h2 by
`scripts/check-h2-versions.sh`), so keep them here and nowhere else.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
from hyperframe.frame import ContinuationFrame, Frame, GoAwayFrame

from .._calls import without_streams_above
from .._constants import MAX_HEADER_BLOCK_BYTES
from .._hpack import BoundedDecoder, StatelessEncoder


class _BoundedFrameBuffer(h2.frame_buffer.FrameBuffer):
    """h2's frame buffer, which caps a header block at 64 CONTINUATION frames of any size (up
    to 64 MiB buffered here), with the codec's byte cap as well."""

    def _update_header_buffer(self, f: Frame | None) -> Frame | None:
        if self._headers_buffer and isinstance(f, ContinuationFrame):
            size = len(f.data) + sum(len(part.data) for part in self._headers_buffer)
            if size > MAX_HEADER_BLOCK_BYTES:
                raise h2.exceptions.DenialOfServiceError("header block exceeds our limit")
        return super()._update_header_buffer(f)


class PatchedH2Connection(h2.connection.H2Connection):
    """h2's client connection with our encoder and settings, whose open-stream count is ours,
    and which a GOAWAY does not end on the spot."""

    # The engine tracks its open calls itself and enforces MAX_CONCURRENT_STREAMS before
    # opening a stream; h2 would recount by scanning every stream it holds on each new one
    # (O(concurrency) per call: a third of the CPU at 64 concurrent calls). The scan also
    # prunes closed streams, so it still runs, amortised, every PRUNE_EVERY streams.
    PRUNE_EVERY = 128
    open_calls = 0
    _opened_since_prune = 0

    def __init__(
        self,
        *,
        stream_window: int,
        max_frame_size: int,
        max_header_list_size: int,
    ) -> None:
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            # We build lower-case bytes headers ourselves and check metadata at the API edge;
            # h2's per-header validation costs about a quarter of a call.
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
        )
        super().__init__(config=config)
        # Stateless request-header encoding (see _hpack.py): cacheable, never in the table.
        self.encoder = StatelessEncoder()  # type: ignore[assignment]
        # The same header block limits as the codec (see _constants.py).
        self.decoder = BoundedDecoder()
        self.incoming_buffer = _BoundedFrameBuffer(server=False)
        self.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: max_frame_size,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_list_size,
            },
        )
        # Initial values count as already in force, so h2 would never apply these two on the
        # server's SETTINGS ACK: set them by hand (the server applies ours before responding).
        self.max_inbound_frame_size = max_frame_size
        self.decoder.max_header_list_size = max_header_list_size

    @property
    def open_outbound_streams(self) -> int:
        self._opened_since_prune += 1
        if self._opened_since_prune >= self.PRUNE_EVERY:
            self._opened_since_prune = 0
            self._open_streams(1)
        return self.open_calls

    @property
    def queued_bytes(self) -> int:
        """How many bytes wait in h2's outbound buffer."""
        return len(self._data_to_send)

    def _receive_goaway_frame(
        self, frame: GoAwayFrame
    ) -> tuple[list[Frame], list[h2.events.Event]]:
        # h2 moves its state machine to CLOSED and drops every queued outbound frame when a
        # GOAWAY arrives, so any later frame, even one in the same read, is a protocol error.
        # RFC 9113 §6.8 lets streams up to `last_stream_id` finish, so keep the state (and the
        # queued WINDOW_UPDATEs, acks and request data those streams still need) as they were,
        # less the frames of streams above it (see without_streams_above).
        state = self.state_machine.state
        queued = without_streams_above(bytes(self._data_to_send), frame.last_stream_id)
        result = super()._receive_goaway_frame(frame)
        self.state_machine.state = state
        self._data_to_send = bytearray(queued) + self._data_to_send
        return result
