#include "kiln/core/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

namespace kiln {
namespace {

const trace::Track* track_named(const std::vector<trace::Track>& tracks, const std::string& name) {
  const auto found = std::find_if(tracks.begin(), tracks.end(), [&](const trace::Track& t) { return t.name == name; });
  return found == tracks.end() ? nullptr : &*found;
}

TEST(Trace, NothingIsRecordedOutsideARecording) {
  trace::stop_recording();
  trace::take_recording();
  {
    const trace::Span span("test", "unrecorded");
    trace::counter("unrecorded counter", 1.0);
  }
  EXPECT_FALSE(trace::recording());
  EXPECT_TRUE(trace::take_recording().empty());
}

TEST(Trace, SpansNestOnTheirThreadsTrackUnderItsName) {
  trace::name_this_thread("test main");
  trace::start_recording();
  const int64_t before = trace::now_ns();
  {
    const trace::Span outer("test", "outer");
    { const trace::Span inner("test", "inner"); }
    trace::counter("things", 3.0);
  }
  std::thread worker([] {
    trace::name_this_thread("test worker");
    const trace::Span span("test", "on the worker");
  });
  worker.join();
  trace::complete_on_track("test device", "kernel", "k", before, 5);
  trace::stop_recording();
  { const trace::Span late("test", "after the recording"); }
  const int64_t after = trace::now_ns();

  const std::vector<trace::Track> tracks = trace::take_recording();
  const trace::Track* main = track_named(tracks, "test main");
  ASSERT_NE(main, nullptr);
  ASSERT_EQ(main->events.size(), 3u);  // inner ends first, then the counter, then outer
  const trace::Event &inner = main->events[0], &counter = main->events[1], &outer = main->events[2];
  EXPECT_EQ(inner.name, "inner");
  EXPECT_EQ(counter.kind, trace::Event::Kind::Counter);
  EXPECT_EQ(counter.name, "things");
  EXPECT_EQ(counter.value, 3.0);
  EXPECT_EQ(outer.name, "outer");
  EXPECT_STREQ(outer.category, "test");
  EXPECT_GE(outer.start_ns, before);
  EXPECT_LE(outer.start_ns, inner.start_ns);
  EXPECT_LE(inner.start_ns + inner.duration_ns, outer.start_ns + outer.duration_ns);
  EXPECT_LE(outer.start_ns + outer.duration_ns, after);
  EXPECT_FALSE(main->device);

  const trace::Track* worker_track = track_named(tracks, "test worker");
  ASSERT_NE(worker_track, nullptr);
  ASSERT_EQ(worker_track->events.size(), 1u);
  EXPECT_EQ(worker_track->events[0].name, "on the worker");
  EXPECT_NE(worker_track->id, main->id);

  const trace::Track* device = track_named(tracks, "test device");
  ASSERT_NE(device, nullptr);
  EXPECT_TRUE(device->device);
  ASSERT_EQ(device->events.size(), 1u);
  EXPECT_EQ(device->events[0].start_ns, before);
  EXPECT_EQ(device->events[0].duration_ns, 5);

  EXPECT_TRUE(trace::take_recording().empty());  // taken
}

TEST(Trace, ASpanOpenWhenTheRecordingStopsIsDropped) {
  trace::start_recording();
  {
    const trace::Span span("test", "cut");
    trace::stop_recording();
  }
  EXPECT_TRUE(trace::take_recording().empty());
}

TEST(Trace, StartingAgainDropsWhatAnEarlierRecordingLeft) {
  trace::start_recording();
  { const trace::Span span("test", "old"); }
  trace::start_recording();
  { const trace::Span span("test", "new"); }
  trace::stop_recording();
  const std::vector<trace::Track> tracks = trace::take_recording();
  size_t events = 0;
  for (const trace::Track& track : tracks)
    for (const trace::Event& event : track.events) {
      EXPECT_EQ(event.name, "new");
      ++events;
    }
  EXPECT_EQ(events, 1u);
}

}  // namespace
}  // namespace kiln
