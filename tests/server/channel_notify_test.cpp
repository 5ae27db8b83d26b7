// Channel::set_notify: the wake-up hook the HTTP side uses instead of blocking on pop().
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "util/channel.h"

namespace deltaserve {
namespace {

TEST(ChannelNotify, RunsAfterPushAndClose) {
  Channel<int> ch;
  int calls = 0;
  ch.set_notify([&] { ++calls; });
  EXPECT_EQ(calls, 0);  // nothing pending
  ch.push(1);
  ch.push(2);
  EXPECT_EQ(calls, 2);
  ch.close();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(*ch.try_pop(), 1);
  EXPECT_EQ(*ch.try_pop(), 2);
  EXPECT_FALSE(ch.try_pop());
  EXPECT_TRUE(ch.closed());
}

TEST(ChannelNotify, SetWhilePendingFiresOnce) {
  Channel<int> ch;
  ch.push(7);
  int calls = 0;
  ch.set_notify([&] { ++calls; });
  EXPECT_EQ(calls, 1);
  ch.set_notify(nullptr);
  ch.push(8);
  EXPECT_EQ(calls, 1);
}

TEST(ChannelNotify, NoLostWakeUpUnderRace) {
  for (int round = 0; round < 200; ++round) {
    Channel<int> ch;
    std::atomic<int> seen{0};
    std::thread producer([&] {
      for (int i = 0; i < 50; ++i) ch.push(i);
      ch.close();
    });
    std::atomic<int> wakeups{0};
    ch.set_notify([&] { wakeups.fetch_add(1); });
    producer.join();
    while (ch.try_pop()) seen.fetch_add(1);
    EXPECT_EQ(seen.load(), 50);
    EXPECT_GE(wakeups.load(), 1);  // at least one wake-up after the hook was set
  }
}

}  // namespace
}  // namespace deltaserve
