"""Deep Q-learning as the PyTorch DQN tutorial writes it: an epsilon-greedy
action chosen by the policy network under torch.no_grad(), a replay
memory, the targets computed by a target network under torch.no_grad(),
a Huber loss, gradient clipping, AdamW, and a soft update of the target
network after every optimisation step. The environment is a small
gridworld written here (no gym): its observations are one-hot positions.

    python dqn_train.py [--steps N]

Each iteration is one environment step followed, once the memory holds a
batch, by one optimisation step. The script times every iteration that
optimised, from its start to the next one's, and prints `UPDATES <n>`,
`ITER_MS <mean over iterations from the 10th update on>` and `ACTED <a
digit per update: 1 where its iteration chose the action with the policy
network, 0 where at random>`.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque, namedtuple
from time import perf_counter

import torch
import torch.nn.functional as F
from torch import nn

Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


class Grid:
    """An 8x8 grid: move in 4 directions, reward 1 at the far corner."""

    size = 8

    def reset(self) -> torch.Tensor:
        self.pos = (0, 0)
        return self.obs()

    def obs(self) -> torch.Tensor:
        o = torch.zeros(self.size * self.size)
        o[self.pos[0] * self.size + self.pos[1]] = 1.0
        return o

    def step(self, action: int) -> tuple[torch.Tensor, float, bool]:
        dr, dc = ((0, 1), (1, 0), (0, -1), (-1, 0))[action]
        r = min(self.size - 1, max(0, self.pos[0] + dr))
        c = min(self.size - 1, max(0, self.pos[1] + dc))
        self.pos = (r, c)
        done = self.pos == (self.size - 1, self.size - 1)
        return self.obs(), (1.0 if done else -0.01), done


class DQN(nn.Module):
    def __init__(self, n_obs: int, n_actions: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(n_obs, 128)
        self.layer2 = nn.Linear(128, 128)
        self.layer3 = nn.Linear(128, n_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.layer1(x))
        x = F.relu(self.layer2(x))
        return self.layer3(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(1)
    batch_size, gamma, tau, lr = 32, 0.99, 0.005, 1e-4
    env = Grid()
    n_obs, n_actions = env.size * env.size, 4
    policy_net = DQN(n_obs, n_actions)
    target_net = DQN(n_obs, n_actions)
    target_net.load_state_dict(policy_net.state_dict())
    optimizer = torch.optim.AdamW(policy_net.parameters(), lr=lr, amsgrad=True)
    memory: deque = deque(maxlen=10000)
    state = env.reset().unsqueeze(0)
    times: list[float] = []
    acts: list[str] = []
    updates = 0
    began = None
    for t in range(args.steps):
        start = perf_counter()
        if began is not None:
            times.append(start - began)
            began = None
        eps = 0.05 + 0.85 * math.exp(-t / 100)
        acted = random.random() > eps
        if acted:
            with torch.no_grad():
                action = policy_net(state).max(1).indices.view(1, 1)
        else:
            action = torch.tensor([[random.randrange(n_actions)]])
        obs, reward, done = env.step(int(action.item()))
        next_state = None if done else obs.unsqueeze(0)
        memory.append(Transition(state, action, next_state, torch.tensor([reward])))
        state = env.reset().unsqueeze(0) if done else next_state
        if len(memory) < batch_size:
            continue
        batch = Transition(*zip(*random.sample(memory, batch_size)))
        non_final_mask = torch.tensor([s is not None for s in batch.next_state])
        non_final_next = torch.cat([s for s in batch.next_state if s is not None])
        state_batch = torch.cat(batch.state)
        action_batch = torch.cat(batch.action)
        reward_batch = torch.cat(batch.reward)
        state_action_values = policy_net(state_batch).gather(1, action_batch)
        next_values = torch.zeros(batch_size)
        with torch.no_grad():
            next_values[non_final_mask] = target_net(non_final_next).max(1).values
        expected = (next_values * gamma) + reward_batch
        loss = F.smooth_l1_loss(state_action_values, expected.unsqueeze(1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
        optimizer.step()
        target_sd, policy_sd = target_net.state_dict(), policy_net.state_dict()
        for key in policy_sd:
            target_sd[key] = policy_sd[key] * tau + target_sd[key] * (1 - tau)
        target_net.load_state_dict(target_sd)
        updates += 1
        acts.append("1" if acted else "0")
        if updates >= 10:
            began = start
    print(f"UPDATES {updates}", flush=True)
    print(f"ITER_MS {sum(times) / len(times) * 1e3:.4f}", flush=True)
    print(f"ACTED {''.join(acts)}", flush=True)


if __name__ == "__main__":
    main()
